"""Recycled buffers from Python: a big tensor allocated in a namespace comes back to its
producer once taken and released, the reader of an earlier tensor never sees a later one,
and status() counts what waits in the pool."""

import numpy as np

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
