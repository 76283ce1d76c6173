"""`tensorctl health`: the probe that deploy/k8s and scripts use, on the gRPC health service."""

import json
import os
import subprocess
import time

import pytest

TENSORD = os.environ.get("TENSORD_BIN", "")
TENSORCTL = os.environ.get("TENSORCTL_BIN", "")


@pytest.fixture
def daemon(tmp_path):
    path = str(tmp_path / "t.sock")
    proc = subprocess.Popen([TENSORD, "--socket", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not os.path.exists(path + ".fd"):
        assert proc.poll() is None and time.monotonic() < deadline, "tensord did not start"
        time.sleep(0.02)
    yield path
    proc.terminate()
    proc.wait(timeout=20)


def health(path, *args):
    return subprocess.run([TENSORCTL, "--socket", path, "health", *args], capture_output=True, text=True, timeout=30)


def test_serving(daemon):
    result = health(daemon)
    assert result.returncode == 0 and result.stdout == "SERVING\n", result
    result = health(daemon, "--json", "--service", "tensord.v1.Broker")
    assert result.returncode == 0, result
    assert json.loads(result.stdout) == {"socket": daemon, "service": "tensord.v1.Broker", "status": "SERVING"}


def test_unknown_service_fails_naming_it(daemon):
    result = health(daemon, "--service", "nope")
    assert result.returncode == 1
    assert "NOT_FOUND" in result.stderr and "'nope'" in result.stderr, result.stderr


def test_no_daemon_fails_naming_the_socket(tmp_path):
    path = str(tmp_path / "none.sock")
    result = health(path, "--timeout", "2")
    assert result.returncode == 1
    assert f"health of {path}: UNAVAILABLE" in result.stderr, result.stderr


def test_both_binaries_say_their_version():
    import re

    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "CMakeLists.txt")) as f:
        version = re.search(r"project\(tensord VERSION (\S+)", f.read()).group(1)
    for binary, name in ((TENSORD, "tensord"), (TENSORCTL, "tensorctl")):
        result = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        # The version, the commit built (git describe; "unknown" without .git) and the
        # memory backends built (host always).
        line = re.fullmatch(rf"{name} {re.escape(version)} \(commit ([0-9a-f]{{7,}}(-dirty)?|unknown); "
                            r"memory backends: host(, cuda)?(, level_zero)?\)\n", result.stdout)
        assert result.returncode == 0 and line, result
