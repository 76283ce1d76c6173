"""Lease lifetime with real processes: garbage collection, release()/with, SIGKILL, fork,
deleters on foreign threads, and interpreter shutdown with live views."""

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import tensord
from tensord import _tensord
from conftest import leases, run_python, session_leases, wait_for

# A holder process: takes a lease on argv[1] and makes views, then obeys stdin commands.
HOLDER = r"""
import gc, sys
import numpy, torch, tensord
c = tensord.connect(lease_cache=False)
t = c.get(sys.argv[1])
views = [t.numpy(), torch.from_dlpack(t), numpy.from_dlpack(t), t.__dlpack__()]
print(c.session_id, flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "release":
        t.release()
    elif command == "drop":
        views.clear()
        gc.collect()
    elif command == "cycle":
        a, b = [t.numpy()], []
        a.append(b); b.append(a)
        del a, b
    c.flush()
    print("ok", flush=True)
"""


class Holder:
    def __init__(self, broker, name):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, name], env=broker.env(), text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read()
        self.session_id = int(line)

    def send(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok", self.proc.stderr.read()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
def published(client, name):
    n = name("life")
    client.put(n, np.arange(1024, dtype=np.float32))
    client.flush()
    assert leases(client, n) == 0
    return n


def test_gc_of_the_last_view_releases_the_lease(broker, client, published):
    h = Holder(broker, published)
    assert session_leases(client, published, h.session_id) >= 1
    h.send("cycle")  # a view in a reference cycle: only the cycle collector frees it
    h.send("release")  # the handle's own reference; the views keep the lease
    assert session_leases(client, published, h.session_id) >= 1
    h.send("drop")  # last views garbage-collected
    wait_for(lambda: session_leases(client, published, h.session_id) == 0,
             what="the holder's lease to go")
    assert h.close() == 0


def test_release_and_with_drop_the_handles_reference_at_once(client, other, published):
    t = client.get(published)
    client.flush()
    assert session_leases(other, published, client.session_id) >= 1
    t.release()
    client.flush()
    assert session_leases(other, published, client.session_id) == 0
    with client.get(published) as t:
        assert t.numpy()[3] == 3.0
        client.flush()
        assert session_leases(other, published, client.session_id) >= 1
    client.flush()
    assert session_leases(other, published, client.session_id) == 0
    with client.get(published) as t:
        view = t.torch()
    client.flush()
    assert session_leases(other, published, client.session_id) >= 1, "a view outlives the with"
    assert view[5].item() == 5.0
    del view
    client.flush()
    wait_for(lambda: session_leases(other, published, client.session_id) == 0)


def test_gc_of_a_dropped_handle(client, other, published):
    t = client.get(published)
    client.flush()
    assert session_leases(other, published, client.session_id) >= 1
    del t
    gc.collect()
    client.flush()
    wait_for(lambda: session_leases(other, published, client.session_id) == 0)


def test_sigkill_releases_the_holders_leases(broker, client, published):
    h = Holder(broker, published)
    assert session_leases(client, published, h.session_id) >= 1
    h.proc.send_signal(signal.SIGKILL)
    h.proc.wait(10)
    wait_for(lambda: session_leases(client, published, h.session_id) == 0,
             what="the broker to release a killed process's leases")
    assert all(s["session_id"] != h.session_id for s in client.stat(published)["holders"])


def test_forked_child_uses_the_client_on_its_own(client, other, published, name):
    held = client.get(published)
    view = held.numpy()
    client.flush()
    parent_session = client.session_id
    child_name = name("child")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read_end)
            # Inherited views stay readable; the child holds no lease through them.
            assert view[7] == 7.0
            assert client.session_id != parent_session
            client.put(child_name, np.full(4, os.getpid(), dtype=np.int64))
            t = client.get(published)
            assert t.numpy()[9] == 9.0
            os.write(write_end, f"{client.session_id}\n".encode())
            t.release()
            client.flush()
            status = 0
        except BaseException as e:  # noqa: BLE001 - reported through the exit status
            os.write(write_end, f"error {e!r}\n".encode())
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as r:
        report = r.read()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, report
    child_session = int(report.split()[0])
    assert child_session != parent_session
    # The parent's session and lease are untouched; the child's went with it.
    assert client.session_id == parent_session
    assert session_leases(other, published, parent_session) >= 1
    wait_for(lambda: session_leases(other, published, child_session) == 0)
    assert client.get(child_name).numpy().tolist() == [pid] * 4
    assert view[7] == 7.0
    del view
    held.release()
    client.flush()
    wait_for(lambda: session_leases(other, published, parent_session) == 0)


class _Items(torch.utils.data.Dataset):
    def __init__(self, client, names):
        self.client, self.names = client, names

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        with self.client.get(self.names[i]) as t:
            return t.torch().clone(), self.client.session_id


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers on 2 cores
def test_dataloader_workers_fork_and_use_the_client(client, name, workers):
    names = [name("dl") for _ in range(8)]
    for i, n in enumerate(names):
        client.put(n, np.full(3, i, dtype=np.float32))
    client.flush()
    loader = torch.utils.data.DataLoader(_Items(client, names), batch_size=2, num_workers=workers,
                                         multiprocessing_context="fork", timeout=20)
    batches = list(loader)
    values = torch.cat([x for x, _ in batches])[:, 0].tolist()
    assert values == [float(i) for i in range(8)]
    sessions = {int(s) for _, ss in batches for s in ss}
    assert client.session_id not in sessions and len(sessions) == workers
    assert client.get(names[0]).numpy()[0] == 0.0


def test_back_to_back_forks_with_a_wait_and_a_watcher_in_flight(client, other, name):
    """DataLoader-style forks in quick succession while another thread of the parent waits
    in take() forever and a watcher is open: each child reaches the broker on its own, the
    parent's wait survives every fork (nothing lost, nothing taken twice) and the watcher
    goes on (with a RESET for each gap)."""
    prefix = name("storm") + "/"
    probe = name("probe")
    client.put(probe, np.arange(4, dtype=np.int32))
    watcher = client.watch(prefix)
    taken = []

    def take_all():
        while True:
            with client.take(prefix, timeout=None) as t:
                value = int(t.numpy()[0])
            if value < 0:
                return
            taken.append(value)

    taker = threading.Thread(target=take_all)
    taker.start()
    rounds = 12
    for r in range(rounds):
        other.put(f"{prefix}{r:04d}", np.full(2, r, dtype=np.int64))
        pids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = 0 if client.get(probe, timeout=10).numpy().tolist() == [0, 1, 2, 3] else 3
                finally:
                    os._exit(code)
            pids.append(pid)
        assert client.get(probe).numpy()[3] == 3
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"round {r}: {status}"
    other.put(f"{prefix}end", np.full(2, -1, dtype=np.int64))
    taker.join(30)
    assert not taker.is_alive()
    assert taken == list(range(rounds))
    kinds, saw_end = [], False
    deadline = time.monotonic() + 20
    while not saw_end and time.monotonic() < deadline:
        event = watcher.next(timeout=1.0)
        if event is None:
            continue
        kinds.append(event["kind"])
        saw_end = event["kind"] == "bound" and event["name"] == f"{prefix}end"
    assert saw_end, kinds
    assert "reset" in kinds


def test_deleter_on_a_native_thread_without_the_gil(client, other, published):
    t = client.get(published)
    capsules = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0))]
    t.release()
    client.flush()
    assert session_leases(other, published, client.session_id) >= 1
    for capsule in capsules:
        _tensord._consume_on_native_thread_for_test(capsule)
    client.flush()
    wait_for(lambda: session_leases(other, published, client.session_id) == 0)


def test_views_dropped_on_many_threads(client, other, published):
    t = client.get(published)
    views = [t.numpy() if i % 2 else t.torch() for i in range(64)]
    t.release()
    barrier = threading.Barrier(8)

    def drop(chunk):
        barrier.wait()
        chunk.clear()

    threads = [threading.Thread(target=drop, args=(views[i::8],)) for i in range(8)]
    del views
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gc.collect()
    client.flush()
    wait_for(lambda: session_leases(other, published, client.session_id) == 0)


SHUTDOWN = r"""
import sys, threading
import numpy, torch, tensord
c = tensord.connect()
t = c.get(sys.argv[1])
keep = [t.numpy(), torch.from_dlpack(t), numpy.from_dlpack(t), t.__dlpack__(),
        t.__dlpack__(max_version=(1, 0))]
cycle = [t.torch()]
cycle.append(cycle)
waiter = threading.Thread(target=lambda: c.get("py/never", timeout=None), daemon=True)
waiter.start()
if sys.argv[2] == "closed":
    c.close()
print("exiting", flush=True)
"""


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_interpreter_shutdown_with_live_views(broker, client, published, mode):
    result = subprocess.run([sys.executable, "-c", SHUTDOWN, published, mode],
                            env=broker.env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "exiting"
    assert "terminate" not in result.stderr and "Fatal" not in result.stderr, result.stderr
    wait_for(lambda: leases(client, published) == 0, what="the exited process's leases to go")


def test_module_imports_without_torch_or_numpy(broker):
    code = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
            "import tensord; c = tensord.connect(); c.put('py/raw', b'abc')\n"
            "print(c.get('py/raw').shape)")
    result = run_python(code, broker.env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(3,)"
