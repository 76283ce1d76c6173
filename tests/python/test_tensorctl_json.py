"""tensorctl --json and the Python package describe things with the same field names, units
and values: a script and a program read a stat, a listing, the status and watch events alike."""

import json
import os
import subprocess

import numpy as np
import pytest

TENSORCTL = os.path.join(os.path.dirname(os.path.dirname(os.environ.get("TENSORD_BIN", ""))), "client", "cli",
                         "tensorctl")


def ctl(broker, *args, **kwargs):
    if not os.path.exists(TENSORCTL):
        pytest.fail(f"no tensorctl at {TENSORCTL}: it is found beside $TENSORD_BIN's build tree")
    out = subprocess.run([TENSORCTL, "--socket", broker.socket, "--json", *args], capture_output=True,
                         text=True, timeout=30, **kwargs)
    assert out.returncode == 0, out.stderr
    return out.stdout


def as_json(value):
    """What a Python dict looks like in JSON (tuples are lists)."""
    return json.loads(json.dumps(value))


def test_stat_and_ls_are_python_dicts(broker, client, name):
    n = name()
    client.put(n, np.zeros((2, 3), np.float32), tags={"k": "v"})
    held = client.get(n)
    assert held.shape == (2, 3)
    assert json.loads(ctl(broker, "stat", n)) == as_json(client.stat(n))
    assert json.loads(ctl(broker, "ls", "py/")) == as_json(client.list("py/"))


def test_status_is_the_python_dict_with_the_same_units(broker, client):
    from_ctl, from_py = json.loads(ctl(broker, "status")), as_json(client.status(sessions=True))
    assert from_ctl.keys() == from_py.keys()
    # Two calls apart: tensorctl's own session comes and goes.
    volatile = {"uptime", "sessions", "leases", "releases_not_found", "leases_reclaimed", "session_usage"}
    assert {k: v for k, v in from_ctl.items() if k not in volatile} == \
        {k: v for k, v in from_py.items() if k not in volatile}
    assert abs(from_ctl["uptime"] - from_py["uptime"]) < 30  # seconds in both
    mine = [s for s in from_py["session_usage"] if s["pid"] == os.getpid()]
    assert len(mine) == 1
    assert [s for s in from_ctl["session_usage"] if s["id"] == mine[0]["id"]][0].keys() == mine[0].keys()
    assert "session_usage" not in client.status()  # only when asked for


def test_status_and_top_trace_memory_to_the_process_holding_it(broker, client, name):
    n = name()
    client.put(n, np.zeros((256, 1024), np.float32))  # 1 MiB
    held = client.get(n)
    status = json.loads(ctl(broker, "status"))
    mine = [s for s in status["session_usage"] if s["pid"] == os.getpid()]
    assert len(mine) == 1, status["session_usage"]
    assert mine[0]["bytes_leased"] >= 1 << 20 and mine[0]["leases"] >= 1 and mine[0]["publishes"] >= 1
    assert mine[0]["client_name"] and mine[0]["uid"] == os.getuid()
    ctl_sessions = [s for s in status["session_usage"] if s["client_name"] == "tensorctl"]
    assert len(ctl_sessions) == 1  # tensorctl's own, while it asked

    # Two refreshes 0.2 s apart, one JSON line each; the second has rates over that span,
    # while this process publishes all along.
    import threading
    import time
    done = threading.Event()

    def publish_meanwhile():
        i = 0
        while not done.is_set():
            client.put(f"{n}-{i % 4}", np.zeros(16, np.float32))
            i += 1
            time.sleep(0.005)

    worker = threading.Thread(target=publish_meanwhile)
    worker.start()
    try:
        lines = ctl(broker, "top", "-n", "2", "-d", "0.2").splitlines()
    finally:
        done.set()
        worker.join()
    assert len(lines) == 2
    first = [s for s in json.loads(lines[0])["session_usage"] if s["pid"] == os.getpid()][0]
    second = [s for s in json.loads(lines[1])["session_usage"] if s["pid"] == os.getpid()][0]
    assert second["publishes"] > first["publishes"]
    assert second["publishes_per_s"] > 0 and second["leases_per_s"] >= 0
    human = subprocess.run([TENSORCTL, "--socket", broker.socket, "status"], capture_output=True, text=True,
                           timeout=30).stdout
    assert f"{os.getpid():>8} " in human and "LEASED" in human
    del held


def test_status_shows_the_memory_pending_hand_overs_pin_by_uid(broker, client, name):
    n = name()
    client.put(n, np.zeros(1 << 20, np.float32))  # 4 MiB, a buffer of its own
    t = client.take(n)
    client.hand_over(t, ttl=3600)
    t.release()
    client.flush()
    from_ctl = json.loads(ctl(broker, "status"))["hand_over_pins"]
    assert from_ctl == as_json(client.status()["hand_over_pins"])
    (mine,) = [p for p in from_ctl if p["uid"] == os.getuid()]
    assert mine["hand_overs"] == 1 and mine["host_bytes"] >= 4 << 20 and mine["device_bytes"] == 0
    human = subprocess.run([TENSORCTL, "--socket", broker.socket, "status"], capture_output=True, text=True,
                           timeout=30).stdout
    assert f"pinned       uid {os.getuid()}: 4.0 MiB host, 0 B device memory held by 1 pending hand-overs" in human, human
    assert client.cancel_hand_overs() == 1
    assert all(p["uid"] != os.getuid() for p in json.loads(ctl(broker, "status"))["hand_over_pins"])


def test_watch_events_are_python_dicts(broker, client, name):
    import select

    watcher = subprocess.Popen([TENSORCTL, "--socket", broker.socket, "--json", "watch", "py/"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = {}
    try:
        with client.watch("py/") as events:
            line = ""
            for _ in range(100):  # tensorctl's watch starts on its own time: publish until it sees one
                n = name("w")
                client.put(n, np.arange(3))
                event = events.next(timeout=10)
                seen[(event["name"], event["generation"])] = event
                if select.select([watcher.stdout], [], [], 0.1)[0]:
                    line = watcher.stdout.readline()
                    break
            assert line, "tensorctl watch printed nothing"
            from_ctl = json.loads(line)
            while (from_ctl["name"], from_ctl["generation"]) not in seen:
                event = events.next(timeout=10)
                seen[(event["name"], event["generation"])] = event
    finally:
        watcher.terminate()
        watcher.wait(10)
    assert from_ctl == as_json(seen[(from_ctl["name"], from_ctl["generation"])])
    assert from_ctl["kind"] == "bound" and from_ctl["tensor"]["name"] == from_ctl["name"]


def test_rm_of_a_prefix_removes_every_name_under_it_and_nothing_else(broker, client, name):
    queue = name("batches") + "/"
    names = [f"{queue}{i:05d}" for i in range(5000)]  # more than one page of a listing
    for start in range(0, len(names), 1000):
        client.put_many({n: np.zeros(0, np.float32) for n in names[start:start + 1000]})
    outside = queue.rstrip("/") + "-other"  # shares the prefix's characters, not its segment
    client.put(outside, np.zeros(1, np.float32))
    done = json.loads(ctl(broker, "rm", queue))
    assert done == {"deleted_prefix": queue, "deleted": 5000, "kept": 0, "gone": 0}
    assert client.list(queue) == []
    assert client.stat(outside)["name"] == outside
    client.put(f"{queue}again", np.zeros(1, np.float32))
    plain = subprocess.run([TENSORCTL, "--socket", broker.socket, "rm", queue], capture_output=True, text=True,
                           timeout=30)
    assert plain.returncode == 0 and plain.stdout == f"removed 1 name under {queue}\n", plain
