"""Bounded work queues (client.queue(prefix, depth)): producers wait while the queue holds
depth tensors, consumers take the oldest, the memory recycles, and a producer that goes away
(killed included) gives back what it was writing."""

import asyncio
import itertools
import json
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import tensord
from conftest import run_python, wait_for
from test_tensorctl_json import TENSORCTL
from test_waits import Alarm, alarm_in

_queues = itertools.count()


@pytest.fixture
def prefix():
    return f"py/q{next(_queues)}/"


def test_items_come_out_oldest_first_under_names_of_their_own(client, other, prefix):
    q = client.queue(prefix, depth=4)
    names = [q.put(np.full(3, i, dtype="float32"))["name"] for i in range(3)]
    t = q.empty((3,), "float32")
    t.numpy()[:] = 3
    names.append(q.publish(t)["name"])
    assert all(n.startswith(prefix) and "/" not in n[len(prefix):] for n in names)
    assert len(set(names)) == 4
    consumer = other.queue(prefix)  # no depth needed to take
    assert [consumer.get().numpy()[0] for _ in range(4)] == [0, 1, 2, 3]


def test_a_full_queue_refuses_at_once_or_after_the_timeout(client, prefix):
    q = client.queue(prefix, depth=2)
    q.put(np.zeros(1))
    q.put(np.zeros(1))
    with pytest.raises(tensord.ResourceExhausted, match=f"queue '{prefix}' is full"):
        q.put(np.zeros(1), timeout=0)
    start = time.monotonic()
    with pytest.raises(tensord.Timeout, match=f"room in queue '{prefix}'"):
        q.empty((1,), "float32", timeout=0.2)
    assert time.monotonic() - start >= 0.2
    stats = q.stats()
    assert (stats["depth"], stats["slots_held"], stats["published"], stats["producers_waiting"]) == (2, 2, 2, 0)
    assert q.qsize() == 2


def test_a_waiting_producer_goes_on_when_a_consumer_takes(client, other, prefix):
    q = client.queue(prefix, depth=1)
    q.put(np.arange(2))
    done = []
    producer = threading.Thread(target=lambda: done.append(q.put(np.arange(3), timeout=10)))
    producer.start()
    wait_for(lambda: q.stats()["producers_waiting"] == 1, what="the producer to wait for room")
    assert not done
    assert other.queue(prefix).get(timeout=5).numpy().tolist() == [0, 1]
    producer.join(timeout=10)
    assert len(done) == 1
    assert other.queue(prefix).get(timeout=5).numpy().tolist() == [0, 1, 2]


def test_the_queue_never_holds_more_than_its_depth(broker, client, other, prefix):
    depth, count = 3, 40
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(other.queue(prefix).stats()["slots_held"])

    def produce():
        producer = tensord.connect(broker.socket)
        q = producer.queue(prefix, depth=depth)
        for i in range(count):
            q.put(np.full(1024, i, dtype="int32"))
        producer.close()

    watcher = threading.Thread(target=watch)
    worker = threading.Thread(target=produce)
    watcher.start()
    worker.start()
    q = client.queue(prefix)
    got = []
    for t in itertools.islice(q, count):
        got.append(int(t.numpy()[0]))
        t.release()
        time.sleep(0.002)
    worker.join(timeout=30)
    stop.set()
    watcher.join(timeout=10)
    assert got == list(range(count))
    assert seen and max(seen) <= depth


def test_a_steady_queue_recycles_its_buffers(client, other, prefix):
    q = client.queue(prefix, depth=2)
    consumer = other.queue(prefix)
    buffers = set()
    for i in range(12):
        t = q.empty((256 * 1024,), "float32")  # 1 MiB: a dedicated buffer, recyclable
        t.numpy()[:] = i
        buffers.add(q.publish(t)["buffer_id"])
        t.release()
        client.flush()  # the producer's release reaches the broker before its next empty()
        got = consumer.get(timeout=5)
        assert got.numpy()[0] == i
        got.release()
        other.flush()
    assert len(buffers) <= 3, buffers


def test_a_tensor_of_a_queue_is_published_only_under_its_prefix(client, prefix):
    t = client.queue(prefix, depth=1).empty((2,), "float32")
    with pytest.raises(tensord.InvalidArgument, match=f"publish it directly under '{prefix}'"):
        client.publish(t, prefix + "sub/x")
    client.publish(t, prefix + "mine")
    assert client.take(prefix).name == prefix + "mine"


def test_bad_queues_are_refused(client, prefix):
    with pytest.raises(ValueError, match="ending in '/'"):
        client.queue("py/noslash", depth=1)
    with pytest.raises(ValueError, match="depth"):
        client.queue(prefix, depth=0)
    with pytest.raises(ValueError, match="without a depth"):
        client.queue(prefix).put(np.ones(1))


def test_a_signal_handler_that_raises_ends_a_wait_for_room(client, prefix):
    q = client.queue(prefix, depth=1)
    q.put(np.ones(1))
    start = time.monotonic()
    with alarm_in(0.3), pytest.raises(Alarm):
        q.put(np.ones(1))
    assert time.monotonic() - start < 3.0
    assert q.stats()["producers_waiting"] == 0  # cancelled at the broker before the exception came out


PRODUCER = r"""
import os, signal, sys
import numpy, tensord
q = tensord.connect().queue(sys.argv[1], depth=2)
q.put(numpy.ones(4))
t = q.empty((4,), "float32")   # being written when it dies
print("ready", flush=True)
sys.stdin.readline()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_producer_gives_back_the_slot_of_what_it_was_writing(broker, client, prefix):
    proc = subprocess.Popen([os.sys.executable, "-c", PRODUCER, prefix], env=broker.env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        q = client.queue(prefix, depth=2)
        assert q.stats()["slots_held"] == 2
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: q.stats()["slots_held"] == 1, what="the dead producer's slot to be given back")
    q.put(np.zeros(4), timeout=5)  # its published one stays for a consumer
    assert client.queue(prefix).get(timeout=5).numpy().tolist() == [1, 1, 1, 1]


def test_tensorctl_queues_shows_depth_and_waiters(broker, client, prefix):
    if not os.path.exists(TENSORCTL):
        pytest.fail(f"no tensorctl at {TENSORCTL}: it is found beside $TENSORD_BIN's build tree")
    q = client.queue(prefix, depth=1)
    q.put(np.ones(1))
    waiter = threading.Thread(target=lambda: q.put(np.ones(1), timeout=10))
    waiter.start()
    try:
        wait_for(lambda: q.stats()["producers_waiting"] == 1, what="a producer waiting for room")
        out = subprocess.run([TENSORCTL, "--socket", broker.socket, "--json", "queues"], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        rows = [r for r in json.loads(out.stdout) if r["prefix"] == prefix]
        assert rows == [{"prefix": prefix, "depth": 1, "slots_held": 1, "published": 1, "producers_waiting": 1,
                         "takers_waiting": 0}]
        text = subprocess.run([TENSORCTL, "--socket", broker.socket, "queues"], capture_output=True, text=True,
                              timeout=30)
        assert text.returncode == 0, text.stderr
        line = next(ln for ln in text.stdout.splitlines() if ln.startswith(prefix))
        assert line.split()[1:] == ["1", "1", "1", "1", "0"]
    finally:
        client.queue(prefix).get(timeout=5)
        waiter.join(timeout=10)


def test_asyncio_puts_gets_and_a_cancelled_put_leaves_no_waiter(broker, prefix):
    async def main():
        async with await tensord.aio.connect(broker.socket) as c:
            q = c.queue(prefix, depth=1)
            await q.put(np.arange(3))
            blocked = asyncio.ensure_future(q.put(np.arange(4)))
            await asyncio.sleep(0.3)
            assert not blocked.done()
            assert (await q.stats())["producers_waiting"] == 1
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
            assert (await q.stats())["producers_waiting"] == 0
            got = []
            async for item in c.queue(prefix):
                got.append(item.numpy().tolist())
                break
            assert got == [[0, 1, 2]]
            t = await q.empty((2,), "float32", timeout=1)
            t.numpy()[:] = 7
            await q.publish(t)
            assert (await q.get(timeout=1)).numpy().tolist() == [7, 7]

    asyncio.run(main())


def test_a_queue_and_its_items_work_from_another_process(broker, client, prefix):
    code = ("import sys, numpy, tensord\n"
            f"q = tensord.connect().queue({prefix!r}, depth=2)\n"
            "for i in range(5): q.put(numpy.full(2, i))\n")
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=run_python(code, broker.env())))
    worker.start()
    got = [int(client.queue(prefix).get(timeout=30).numpy()[0]) for _ in range(5)]
    worker.join(timeout=60)
    assert result["r"].returncode == 0, result["r"].stderr
    assert got == [0, 1, 2, 3, 4]
