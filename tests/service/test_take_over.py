"""Restarts that keep tensors: `tensord --take-over` with real processes. The new daemon
takes the running one's sockets and named tensors (names, data, generations, tags, TTLs),
serves them, and the old one ends its sessions and exits 0; clients reconnect."""

import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

import tensord

TENSORD = os.environ.get("TENSORD_BIN", "")


class Daemon:
    def __init__(self, directory, name, *args):
        self.socket = os.path.join(directory, "t.sock")
        self.log_path = os.path.join(directory, f"{name}.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([TENSORD, "--socket", self.socket, *args], stdout=log,
                                         stderr=subprocess.STDOUT)

    def wait_serving(self, marker="serving on"):
        deadline = time.monotonic() + 30
        while marker not in self.log():
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.02)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


@pytest.fixture
def old(tmp_path):
    d = Daemon(str(tmp_path), "old")
    d.wait_serving()
    yield d
    d.stop()


def take_over(tmp_path, old):
    new = Daemon(str(tmp_path), "new", "--take-over")
    assert old.proc.wait(timeout=30) == 0, old.log()  # it exits once the new one serves
    new.wait_serving()
    return new


def test_names_data_generations_and_tags_survive(tmp_path, old):
    c = tensord.connect(old.socket)
    small = np.arange(12, dtype=np.float32)            # an arena's
    big = np.full((512, 1024), 7, dtype=np.int32)      # a buffer of its own (2 MiB)
    c.put("keep/small", small, tags={"epoch": "3"})
    c.put("keep/small", small * 2)                     # generation 2 of the name
    c.put("keep/big", big)
    c.put("keep/ttl", small, ttl=600)
    c.put("keep/short", small, ttl=0.5)                # gone before it could be carried
    before = {i["name"]: i for i in c.list("keep/")}
    held = c.get("keep/big")                           # a lease held across the take-over
    time.sleep(0.6)

    new = take_over(tmp_path, old)
    try:
        assert "took over 3 named tensors" in new.log(), new.log()
        # The held view still reads the same memory, which the new daemon keeps.
        assert np.array_equal(np.from_dlpack(held), big)
        # The session ended with the old daemon; the library reconnects on the next call.
        after = {i["name"]: i for i in tensord.connect(new.socket).list("keep/")}
        assert sorted(after) == ["keep/big", "keep/small", "keep/ttl"]
        for name in after:
            assert after[name]["generation"] == before[name]["generation"], name
            assert after[name]["tags"] == before[name]["tags"], name
        d = tensord.connect(new.socket)
        assert np.array_equal(np.from_dlpack(d.get("keep/small")), small * 2)
        assert np.array_equal(np.from_dlpack(d.get("keep/big")), big)
        assert d.stat("keep/small")["tags"] == {}
        # Generations go on from the old daemon's.
        d.put("keep/small", small)
        assert d.stat("keep/small")["generation"] > max(i["generation"] for i in before.values())
        # The old client reconnects by itself.
        assert np.array_equal(np.from_dlpack(c.get("keep/big")), big)
        # A TTL carried as a deadline still ends the binding.
        d.put("keep/soon", small, ttl=1.0)
        soon = take_over(tmp_path, new)
        assert tensord.connect(soon.socket).stat("keep/ttl")["name"] == "keep/ttl"
        deadline = time.monotonic() + 10
        while any(i["name"] == "keep/soon" for i in tensord.connect(soon.socket).list("keep/")):
            assert time.monotonic() < deadline, "keep/soon's TTL did not end it after the take-over"
            time.sleep(0.1)
        soon.stop()
    finally:
        new.stop()


def test_the_daemon_footprint_is_what_it_carried(tmp_path, old):
    c = tensord.connect(old.socket)
    for i in range(50):
        c.put(f"many/{i}", np.full(1000, i, dtype=np.float32))
    c.delete("many/7")
    status_before = c.status()
    new = take_over(tmp_path, old)
    try:
        d = tensord.connect(new.socket)
        status = d.status()
        assert status["named_tensors"] == 49
        assert status["host_bytes_in_use"] <= status_before["host_bytes_in_use"]
        for i in (0, 13, 49):
            assert np.from_dlpack(d.get(f"many/{i}"))[0] == i
    finally:
        new.stop()


def test_no_running_daemon_is_an_error_naming_the_socket(tmp_path):
    result = subprocess.run([TENSORD, "--socket", str(tmp_path / "t.sock"), "--take-over"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 1
    assert f"no running tensord hands over at {tmp_path / 't.sock'}.takeover" in result.stderr, result.stderr


def test_a_second_daemon_without_take_over_is_told_about_it(tmp_path, old):
    result = subprocess.run([TENSORD, "--socket", old.socket], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "start this one with --take-over" in result.stderr, result.stderr


def test_a_successor_that_vanishes_leaves_the_old_daemon_serving(tmp_path, old):
    c = tensord.connect(old.socket)
    c.put("stay/a", np.ones(4, np.float32))
    # A would-be successor that asks, takes the state, and goes away without serving.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(old.socket + ".takeover")
    s.send(b"\x08\x01")  # TakeOverMessage{request: 1}
    s.settimeout(10)
    msg, ancdata, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(3 * 4))
    fds = [fd for level, kind, data in ancdata if kind == socket.SCM_RIGHTS
           for fd in np.frombuffer(data, dtype=np.int32)]
    assert len(fds) == 3, (msg, ancdata)
    for fd in fds:
        os.close(int(fd))
    s.close()
    deadline = time.monotonic() + 10
    while "serves on" not in old.log():
        assert time.monotonic() < deadline, old.log()
        time.sleep(0.05)
    assert old.proc.poll() is None
    d = tensord.connect(old.socket)
    d.put("stay/b", np.zeros(4, np.float32))  # names may change again
    assert sorted(i["name"] for i in d.list("stay/")) == ["stay/a", "stay/b"]


def test_another_uid_may_not_take_over(tmp_path, old):
    if os.getuid() != 0:
        pytest.skip("needs root to run a process as another uid")
    result = subprocess.run([TENSORD, "--socket", old.socket, "--take-over"], capture_output=True, text=True,
                            timeout=30, user=65534, group=65534)
    assert result.returncode != 0
    assert old.proc.poll() is None, "the old daemon must go on"


def test_metrics_say_what_a_restart_kept(tmp_path, old):
    from test_metrics import UnixHTTPConnection, get, parse, value

    c = tensord.connect(old.socket)
    for i in range(3):
        c.put(f"m/{i}", np.zeros(8, np.float32))
    metrics = str(tmp_path / "metrics.sock")
    new = Daemon(str(tmp_path), "new", "--take-over", "--metrics-address", "unix:" + metrics)
    try:
        assert old.proc.wait(timeout=30) == 0
        new.wait_serving("metrics: GET /metrics at")
        status, _, body = get(UnixHTTPConnection(metrics))
        assert status == 200
        _, samples = parse(body)
        assert value(samples, "tensord_restart_tensors_kept", **{"from": "take-over"}) == 3
        assert value(samples, "tensord_restart_entries_refused", **{"from": "take-over"}) == 0
    finally:
        new.stop()
