"""Fixtures: a real `tensord` daemon (the build tree's binary, $TENSORD_BIN) on a socket in a
temporary directory, and clients connected to it.

Run from a build tree: PYTHONPATH=<build>/python TENSORD_BIN=<build>/server/tensord
/usr/bin/python3 -m pytest tests/python (ctest sets both).
"""

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import tensord

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "client", "python", "examples")


def _daemon_binary():
    path = os.environ.get("TENSORD_BIN")
    if not path:
        pytest.exit("TENSORD_BIN is not set: point it at the built tensord daemon", returncode=2)
    return path


class Broker:
    """One tensord process serving on <tmp>/t.sock."""

    def __init__(self, directory, args=()):
        self.socket = os.path.join(directory, "t.sock")
        self.log_path = os.path.join(directory, "tensord.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [_daemon_binary(), "--socket", self.socket, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tensord exited with {self.proc.returncode}: {self.log()}")
            if os.path.exists(self.socket) and os.path.exists(self.socket + ".fd"):
                try:
                    tensord.connect(self.socket).close()
                    break
                except tensord.Error:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensord did not start: {self.log()}")
            time.sleep(0.02)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def env(self):
        """An environment for a child process that uses this broker and this package."""
        env = dict(os.environ)
        env["TENSORD_SOCKET"] = self.socket
        return env

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture
def broker():
    with tempfile.TemporaryDirectory(prefix="tensord-py-") as directory:
        b = Broker(directory)
        try:
            yield b
        finally:
            b.stop()
        assert b.proc.returncode == 0, f"tensord exited with {b.proc.returncode}: {b.log()}"


@pytest.fixture
def client(broker):
    # No lease cache: a lease goes the moment its last view does, which the tests observe.
    c = tensord.connect(broker.socket, lease_cache=False)
    yield c
    c.close()


@pytest.fixture
def other(broker):
    """A second session in this process, for looking at what the first one holds."""
    c = tensord.connect(broker.socket, lease_cache=False)
    yield c
    c.close()


_counter = itertools.count()


@pytest.fixture
def name():
    """Makes a fresh name in namespace 'py' per call."""
    return lambda stem="t": f"py/{stem}{next(_counter)}"


def leases(client, name):
    """How many leases the broker counts on the tensor bound to name."""
    return sum(h["leases"] for h in client.stat(name)["holders"])


def session_leases(client, name, session_id):
    return sum(
        h["leases"] for h in client.stat(name)["holders"] if h["session_id"] == session_id
    )


def session_waiting(client, session_id):
    """How many acquires and takes of a session wait at the broker now (0 for a closed
    session): what a test waits for instead of sleeping until a consumer is blocked."""
    usage = client.status(sessions=True)["session_usage"]
    return sum(u["waiting"] for u in usage if u["id"] == session_id)


def wait_for(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def run_python(code, env, timeout=60):
    """Runs code in a fresh Debian python3 with this package; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )
