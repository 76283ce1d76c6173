"""A daemon run as a dedicated user: clients refuse it unless told to trust its uid, by
connect(trusted_daemon_uids=...), $TENSORD_TRUSTED_DAEMON_UIDS or tensorctl's
--trusted-daemon-uid, and pickled clients and tensors carry that trust to their receivers.
Running the daemon as another uid needs root; those tests skip otherwise."""

import os
import pickle
import shutil
import signal
import subprocess
import tempfile
import time

import numpy as np
import pytest

import tensord
from conftest import run_python

DAEMON_UID = 65534  # nobody: neither root nor the test's uid
TENSORCTL = os.path.join(os.path.dirname(os.path.dirname(os.environ.get("TENSORD_BIN", ""))), "client", "cli",
                         "tensorctl")


def _as_daemon_user():
    os.setgroups([])
    os.setgid(DAEMON_UID)
    os.setuid(DAEMON_UID)


@pytest.fixture
def foreign_broker():
    """tensord running as uid 65534 in a directory of its own; yields its socket path."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the daemon runs as another uid (65534)")
    top = tempfile.mkdtemp(prefix="tensord-trust-")
    os.chmod(top, 0o755)
    directory = os.path.join(top, "run")
    os.mkdir(directory, 0o700)
    os.chown(directory, DAEMON_UID, DAEMON_UID)
    socket = os.path.join(directory, "t.sock")
    log = open(os.path.join(top, "tensord.log"), "wb")
    proc = subprocess.Popen([os.environ["TENSORD_BIN"], "--socket", socket], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, preexec_fn=_as_daemon_user)
    try:
        deadline = time.monotonic() + 20
        while not (os.path.exists(socket) and os.path.exists(socket + ".fd")):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log.name, "rb") as f:
                    raise RuntimeError(f"tensord did not start as uid {DAEMON_UID}: {f.read().decode()[-2000:]}")
            time.sleep(0.02)
        yield socket
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(top, ignore_errors=True)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TENSORD_TRUSTED_DAEMON_UIDS"}
    env.update(extra)
    return env


def test_a_daemon_of_another_uid_is_refused_unless_trusted(foreign_broker, monkeypatch):
    monkeypatch.delenv("TENSORD_TRUSTED_DAEMON_UIDS", raising=False)
    with pytest.raises(tensord.PermissionDenied, match=r"uid 65534 .*\$TENSORD_TRUSTED_DAEMON_UIDS"):
        tensord.connect(foreign_broker)
    with tensord.connect(foreign_broker, trusted_daemon_uids=[DAEMON_UID]) as client:
        client.put("t/x", np.arange(5, dtype=np.int64))
        assert client.get("t/x").numpy().tolist() == [0, 1, 2, 3, 4]


def test_the_environment_names_trusted_uids(foreign_broker):
    code = (f"import tensord\nc = tensord.connect({foreign_broker!r})\n"
            "c.put('t/env', [1, 2])\nprint(c.get('t/env').numpy().tolist())\n")
    trusted = run_python(code, _env(TENSORD_TRUSTED_DAEMON_UIDS=f"1234, {DAEMON_UID}"))
    assert trusted.returncode == 0, trusted.stderr
    assert trusted.stdout.strip() == "[1, 2]"
    refused = run_python(code, _env())
    assert refused.returncode != 0 and "PermissionDenied" in refused.stderr


def test_pickled_clients_and_tensors_carry_the_trust(foreign_broker, tmp_path):
    client = tensord.connect(foreign_broker, trusted_daemon_uids=[DAEMON_UID])
    client.put("t/p", np.full(3, 7, np.int32))
    path = tmp_path / "pickles"
    with open(path, "wb") as f:
        pickle.dump((client, client.get("t/p")), f)
    # The receiver's environment trusts no one: what it trusts came in the pickles.
    code = (f"import pickle, tensord\nwith open({str(path)!r}, 'rb') as f:\n    c, t = pickle.load(f)\n"
            "print(t.numpy().tolist(), c.get('t/p').numpy().tolist())\n")
    done = run_python(code, _env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[7, 7, 7] [7, 7, 7]"
    client.close()


def test_tensorctl_trusts_a_uid_it_is_given(foreign_broker):
    if not os.path.exists(TENSORCTL):
        pytest.fail(f"no tensorctl at {TENSORCTL}: it is found beside $TENSORD_BIN's build tree")
    base = [TENSORCTL, "--socket", foreign_broker, "--json", "status"]
    refused = subprocess.run(base, capture_output=True, text=True, env=_env(), timeout=30)
    assert refused.returncode != 0 and "$TENSORD_TRUSTED_DAEMON_UIDS" in refused.stderr
    flag = subprocess.run(base + ["--trusted-daemon-uid", str(DAEMON_UID)], capture_output=True, text=True,
                          env=_env(), timeout=30)
    assert flag.returncode == 0, flag.stderr
    env = subprocess.run(base, capture_output=True, text=True, env=_env(TENSORD_TRUSTED_DAEMON_UIDS=str(DAEMON_UID)),
                         timeout=30)
    assert env.returncode == 0, env.stderr


def test_a_malformed_list_is_refused_naming_it(broker, monkeypatch):
    monkeypatch.setenv("TENSORD_TRUSTED_DAEMON_UIDS", "10001,tensord")
    with pytest.raises(tensord.InvalidArgument, match=r"\$TENSORD_TRUSTED_DAEMON_UIDS: 'tensord' is not a uid"):
        tensord.connect(broker.socket)
    # An explicit list is used instead of the environment's.
    tensord.connect(broker.socket, trusted_daemon_uids=[10001]).close()
    with pytest.raises(ValueError, match="not a uid"):
        tensord.connect(broker.socket, trusted_daemon_uids=[-1])
    with pytest.raises(TypeError, match="not a string"):
        tensord.connect(broker.socket, trusted_daemon_uids="10001")
