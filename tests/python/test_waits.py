"""Blocking waits: one request to the broker for the whole wait, however long, and Ctrl-C
(a signal handler that raises) cancels it there."""

import os
import signal
import socket
import tempfile
import threading
import time

import numpy as np
import pytest

import tensord
from conftest import Broker, leases, session_waiting


class Alarm(Exception):
    pass


class alarm_in:
    """SIGALRM after `seconds`, its handler raising Alarm (raise_=True) or only counting."""

    def __init__(self, seconds, raise_=True):
        self.seconds, self.raise_, self.fired = seconds, raise_, 0

    def _handler(self, signum, frame):
        self.fired += 1
        if self.raise_:
            raise Alarm()

    def __enter__(self):
        self._old = signal.signal(signal.SIGALRM, self._handler)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._old)


@pytest.mark.parametrize("call", ["get", "take", "get_many", "take_many"])
def test_a_signal_handler_that_raises_ends_a_forever_wait(client, other, name, call):
    n = name("never") + ("/" if call.startswith("take") else "")
    wait = {
        "get": lambda: client.get(n, timeout=None),
        "take": lambda: client.take(n, timeout=None),
        "get_many": lambda: client.get_many([n, name("never")], timeout=None),
        "take_many": lambda: client.take_many(n, 4, timeout=None),
    }[call]
    start = time.monotonic()
    with alarm_in(0.3), pytest.raises(Alarm):
        wait()
    assert time.monotonic() - start < 3.0
    # The wait was cancelled at the broker before the exception came out.
    assert session_waiting(other, client.session_id) == 0
    # And nothing waits for the name any more: a tensor published now stays bound, unheld.
    target = n + "x" if call.startswith("take") else n
    other.put(target, np.arange(3))
    other.flush()
    time.sleep(0.2)
    assert [e["name"] for e in other.list(target)] == [target]
    assert leases(other, target) == 0


def test_a_signal_handler_that_does_not_raise_leaves_the_wait_alone(client, other, name):
    n = name()
    timer = threading.Timer(0.6, lambda: other.put(n, np.arange(4)))
    timer.start()
    try:
        with alarm_in(0.2, raise_=False) as alarm:
            t = client.get(n, timeout=None)
    finally:
        timer.join()
    assert alarm.fired == 1
    assert t.numpy().tolist() == [0, 1, 2, 3]


def test_a_wait_on_another_thread_is_not_interrupted_and_still_ends(client, other, name):
    n = name()
    got = []
    worker = threading.Thread(target=lambda: got.append(client.get(n, timeout=10)))
    worker.start()
    deadline = time.monotonic() + 5
    while session_waiting(other, client.session_id) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    other.put(n, np.ones(2))
    worker.join(timeout=10)
    assert [g.numpy().tolist() for g in got] == [[1.0, 1.0]]


def _scrape(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def _acquires(path):
    """{code: count} of the Acquire requests the broker's session streams have answered."""
    counts = {}
    prefix = 'tensord_rpcs_total{method="Acquire",transport="session",code="'
    for line in _scrape(path).splitlines():
        if line.startswith(prefix):
            code, _, value = line[len(prefix):].partition('"} ')
            counts[code] = counts.get(code, 0) + int(value)
    return counts


@pytest.fixture
def metered():
    with tempfile.TemporaryDirectory(prefix="tensord-py-") as directory:
        metrics = os.path.join(directory, "metrics.sock")
        b = Broker(directory, ["--metrics-address", "unix:" + metrics])
        try:
            yield b, metrics
        finally:
            b.stop()


def test_a_long_wait_is_one_request(metered, name):
    broker, metrics = metered
    with tensord.connect(broker.socket, lease_cache=False) as client:
        assert _acquires(metrics) == {}
        start = time.monotonic()
        with alarm_in(0.5, raise_=False), pytest.raises(tensord.Timeout) as e:
            client.get(name(), timeout=1.5)  # woken by a signal on the way, too
        assert time.monotonic() - start >= 1.45
        assert e.value.message.endswith("did not arrive within 1.5 s")
        assert _acquires(metrics) == {"DEADLINE_EXCEEDED": 1}

        with alarm_in(0.5), pytest.raises(Alarm):
            client.get(name(), timeout=None)
        assert _acquires(metrics) == {"DEADLINE_EXCEEDED": 1, "CANCELLED": 1}
