"""Recycled buffers from Python: a big tensor allocated in a namespace comes back to its
producer once taken and released, the reader of an earlier tensor never sees a later one,
and status() counts what waits in the pool."""

import os
import pickle

import numpy as np

import tensord

from conftest import wait_for

BIG = 3 << 20  # above the 1 MiB arena limit: a dedicated, recyclable buffer


def test_a_taken_batch_buffer_serves_the_next_empty(client, other, name):
    first = name("q")
    t = client.empty((BIG,), "uint8", ns="py")
    t.numpy().fill(1)
    info = client.publish(t, first)
    t.release()
    assert info["recyclable"] and not info["arena"]

    # The reader holds the first batch: the next one must get other memory.
    held = other.take(first, timeout=5.0)
    u = client.empty((BIG,), "uint8", ns="py")
    u.numpy().fill(2)
    second = client.publish(u, name("q"))
    u.release()
    assert second["buffer_id"] != info["buffer_id"]
    assert int(held.numpy()[::4096].min()) == 1 and int(held.numpy()[::4096].max()) == 1

    held.release()
    other.flush()
    wait_for(lambda: client.status()["pooled_buffers"] == 1, what="the first buffer pooled")
    assert client.status()["host_bytes_pooled"] == BIG
    v = client.empty((BIG,), "uint8", ns="py")
    v.numpy().fill(3)
    third = client.publish(v, name("q"))
    v.release()
    assert third["buffer_id"] == info["buffer_id"]
    got = other.get(third["name"])
    assert np.all(got.numpy() == 3)


def test_put_recycles_in_the_names_namespace(client, other, name):
    first = name("p")
    info = client.put(first, np.ones(BIG, np.uint8))
    assert info["recyclable"]
    other.take(first, timeout=5.0).release()
    other.flush()
    wait_for(lambda: client.status()["pooled_buffers"] == 1, what="the buffer pooled")
    again = client.put(name("p"), np.full(BIG, 7, np.uint8))
    assert again["buffer_id"] == info["buffer_id"]
    assert np.all(other.get(again["name"]).numpy() == 7)


def test_a_readonly_take_of_a_recycled_buffer_sees_each_batch(client, other, name):
    prefix = name("ro") + "/"
    t = client.empty((BIG,), "uint8", ns="py")
    t.numpy().fill(1)
    first = client.publish(t, prefix + "1")
    t.release()

    got = other.take(prefix, timeout=5.0, readonly=True)
    assert got.readonly
    a = got.numpy()
    assert not a.flags.writeable and int(a[::4096].min()) == 1 and int(a.max()) == 1
    del a
    got.release()
    other.flush()
    wait_for(lambda: client.status()["pooled_buffers"] == 1, what="the buffer pooled")

    u = client.empty((BIG,), "uint8", ns="py")
    u.numpy().fill(2)
    second = client.publish(u, prefix + "2")
    u.release()
    assert second["buffer_id"] == first["buffer_id"]
    (again,) = other.take_many(prefix, 4, timeout=5.0, readonly=True)
    assert again.readonly and np.all(again.numpy() == 2)


def _tensors(client):
    return client.status()["tensors"]


def test_allocate_ahead_grants_the_next_batch_early_and_every_batch_stays_intact(broker, other, name):
    import tensord

    producer = tensord.connect(broker.socket, lease_cache=False, allocate_ahead=True)
    try:
        prefix = name("ahead") + "/"
        for i in range(8):
            t = producer.empty((BIG,), "uint8", ns="py")
            if i == 0:
                # Granted a recyclable buffer: the next one is asked for at once.
                wait_for(lambda: _tensors(other) == 2, what="an allocation sent ahead")
            t.numpy().fill(i + 1)
            producer.publish(t, prefix + str(i))
            t.release()
            got = other.take(prefix + str(i), timeout=5.0)
            assert int(got.numpy()[::4096].min()) == i + 1 and int(got.numpy()[::4096].max()) == i + 1
            got.release()
            other.flush()

        # A forked child starts its own session; the parent's early allocation survives the
        # fork's drain as a released lease, never as a lost one.
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                c = producer.empty((4,), "float32", ns="py")
                c.numpy().fill(5)
                producer.publish(c, prefix + "child")
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert np.all(other.take(prefix + "child", timeout=5.0).numpy() == 5)
        t = producer.empty((BIG,), "uint8", ns="py")
        t.numpy().fill(9)
        producer.publish(t, prefix + "after")
        t.release()
        assert int(other.take(prefix + "after", timeout=5.0).numpy().min()) == 9

        # A pickled client carries the setting: its copy allocates ahead too.
        other.flush()
        wait_for(lambda: _tensors(other) == 1, what="only the producer's next batch left")
        copy = pickle.loads(pickle.dumps(producer))
        u = copy.empty((BIG,), "uint8", ns="py")
        wait_for(lambda: _tensors(other) == 3, what="the copy's allocation sent ahead")
        u.release()
        copy.close()
    finally:
        producer.close()
    # Closed sessions give back what they asked for ahead.
    wait_for(lambda: _tensors(other) == 0 and other.status()["host_bytes_in_use"] == 0,
             what="every buffer freed")


def test_plain_empties_recycle_once_the_client_publishes_into_one_namespace(client, other):
    """No ns=: the first plain tensor gets a dedicated buffer, published into py; the next
    ones go in py and their buffers come back as with ns=."""
    buffers = []
    for i in range(6):
        t = client.empty((BIG,), "uint8")
        t.numpy().fill(i)
        info = client.publish(t, f"py/plain/{i}")
        t.release()
        client.flush()  # the producer's release reaches the broker before its next empty()
        buffers.append(info["buffer_id"])
        got = other.take("py/plain/", timeout=5.0)
        assert int(got.numpy()[::4096].min()) == i and int(got.numpy()[::4096].max()) == i
        got.release()
        other.flush()
    # From the second on, one or two buffers serve every tensor.
    assert len(set(buffers[1:])) <= 2, buffers


def test_a_plain_tensor_published_into_another_namespace_is_copied_there_never_recycled_across(client, other):
    """Buffers stay in their namespace: a plain tensor placed in py (where the client has
    published) but published into shared gets a buffer of its own there, so a reader of py
    that keeps its mapping of a py buffer never sees shared's bytes in it."""
    t = client.empty((BIG,), "uint8")
    t.numpy().fill(7)
    client.publish(t, "py/ns/a")
    t.release()
    reader = other.take("py/ns/a", timeout=5.0)  # maps the py buffer
    py_buffer = reader.info["buffer_id"]
    reader.release()
    other.flush()
    u = client.empty((BIG,), "uint8")  # placed in py: may reuse the buffer the reader mapped
    u.numpy().fill(9)
    placed = u.info["buffer_id"]
    info = client.publish(u, "shared/ns/b")  # ...and published elsewhere: copied
    assert u.name == "shared/ns/b" and u.info["buffer_id"] == info["buffer_id"]
    assert info["buffer_id"] not in (placed, py_buffer)
    got = other.take("shared/ns/b", timeout=5.0)
    assert int(got.numpy()[::4096].min()) == 9 and int(got.numpy()[::4096].max()) == 9
    got.release()
    # The client now publishes into shared: its next plain tensor goes there, no copy.
    v = client.empty((BIG,), "uint8")
    v.numpy().fill(3)
    assert client.publish(v, "shared/ns/c")["buffer_id"] == v.info["buffer_id"]


def test_a_small_plain_tensor_keeps_a_buffer_of_its_own(client):
    """No ns=: a dedicated buffer, never an arena slot beside other tensors, also once the
    client has a namespace to place plain tensors in."""
    for i in range(3):
        t = client.empty((16,), "float32")
        info = client.publish(t, f"py/small/{i}")
        t.release()
        assert not info["arena"], info


READER = r"""
import sys, tensord
c = tensord.connect(sys.argv[1])
for _ in range(int(sys.argv[2])):
    t = c.take("pa/", timeout=30)
    a = t.numpy()
    print(t.info["buffer_id"], int(a[::4096].min()), int(a[::4096].max()), flush=True)
    t.release()
    c.flush()
try:
    c.get("pc/0")
    print("read pc", flush=True)
except tensord.PermissionDenied:
    print("pc refused", flush=True)
"""


def test_plain_tensors_switching_namespaces_never_show_a_reader_another_namespaces_bytes():
    """A producer (root) publishes plain tensors into pa and pc in turns; a reader that may
    read only pa (uid 65534, by ACL) takes every pa tensor and keeps taking while the
    producer's buffers recycle: no buffer of pa ever carries pc's bytes, and pc is refused."""
    import subprocess
    import tempfile

    import pytest

    from conftest import Broker

    if os.geteuid() != 0:
        pytest.skip("needs root, to run the reader as uid 65534")
    directory = tempfile.mkdtemp(prefix="tensord-py-uid-")
    os.chmod(directory, 0o755)
    config = os.path.join(directory, "acl.toml")
    with open(config, "w") as f:
        f.write("[acl.pa]\nread_uids = [65534]\nwrite_uids = [65534]\n[acl.pc]\nread_uids = [0]\n")  # a take unbinds: write
    broker = Broker(directory, ["--config", config, "--socket-group", "65534"])
    try:
        producer = tensord.connect(broker.socket)
        turns = ["pa"] * 3 + ["pc"] * 3 + ["pa"] * 3 + ["pc"] * 2 + ["pa"] * 2
        reader = subprocess.Popen(
            [os.sys.executable, "-c", READER, broker.socket, str(turns.count("pa"))],
            env=broker.env(), stdout=subprocess.PIPE, text=True,
            preexec_fn=lambda: (os.setgroups([]), os.setgid(65534), os.setuid(65534)))
        buffers = {"pa": set(), "pc": set()}
        seen = []
        for i, ns in enumerate(turns):
            t = producer.empty((BIG,), "uint8")
            t.numpy().fill(i if ns == "pa" else 200)
            buffers[ns].add(producer.publish(t, f"{ns}/{i}")["buffer_id"])
            t.release()
            if ns == "pa":  # the reader takes it (and releases it) before the next one is made
                seen.append(reader.stdout.readline().split())
            else:
                producer.delete(f"{ns}/{i}")  # nobody takes pc's: gone, its buffer pooled
        assert reader.stdout.readline().strip() == "pc refused"
        assert reader.wait(timeout=30) == 0
        expected = [i for i, ns in enumerate(turns) if ns == "pa"]
        assert [(int(lo), int(hi)) for _, lo, hi in seen] == [(i, i) for i in expected]
        assert {int(b) for b, _, _ in seen} <= buffers["pa"]
        assert not buffers["pa"] & buffers["pc"], buffers  # no buffer served both namespaces
        assert len(buffers["pa"]) < turns.count("pa")  # and pa's did recycle
    finally:
        broker.stop()
