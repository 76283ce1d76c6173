"""put_many / get_many: pipelined batches, all or nothing, errors that name the element; and
arena mappings (a stream of small tensors in one arena is mapped once)."""

import threading
import time

import numpy as np
import pytest
import torch

import tensord
from conftest import leases


def test_put_many_and_get_many_round_trip_torch_and_numpy(client, other, name):
    items = {
        name("n"): np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],  # strided
        name("t"): torch.linspace(0, 1, 5, dtype=torch.float64),
        name("b"): torch.tensor([True, False, True]),  # bool, refused by torch's DLPack
        name("u"): np.array([1, 2, 65535], dtype=np.uint16),
        name("z"): np.zeros((2, 0), dtype=np.float32),  # no bytes at all
        name("s"): np.array(2.5, dtype=np.float32),
    }
    infos = client.put_many(items)
    assert [i["name"] for i in infos] == list(items)
    assert all(i["state"] == "sealed" for i in infos)
    assert infos[0]["shape"] == (3, 2) and infos[0]["dtype"] == "int16"
    got = other.get_many(list(items))
    assert [g.name for g in got] == list(items)
    np.testing.assert_array_equal(got[0].numpy(), items[list(items)[0]])
    assert torch.equal(torch.from_dlpack(got[1]), items[list(items)[1]])
    assert got[2].torch().tolist() == [1, 0, 1] and got[2].dtype == "bool"
    assert got[3].numpy().tolist() == [1, 2, 65535]
    assert got[4].shape == (2, 0)
    assert got[5].numpy().item() == 2.5
    # One lease per element, as with get(); the producer's own went with put_many.
    client.flush()
    other.flush()
    assert [leases(client, n) for n in items] == [1] * len(items)


def test_put_many_takes_pairs_and_options(client, name):
    names = [name("p") for _ in range(3)]
    first = client.put_many(((n, np.full(4, k, dtype=np.float32)) for k, n in enumerate(names)),
                            ttl=30.0)
    assert [i["name"] for i in first] == names
    infos = client.put_many([(n, torch.full((2,), 9.0)) for n in names], if_absent=False)
    assert all(i["generation"] > f["generation"] for i, f in zip(infos, first))
    assert [t.numpy().tolist() for t in client.get_many(names)] == [[9.0, 9.0]] * 3
    with pytest.raises(ValueError, match="exclude each other"):
        client.put_many([(n, np.zeros(1)) for n in names], if_absent=True, if_generation=2)
    assert client.put_many({}) == [] and client.get_many([]) == []


def test_get_many_is_all_or_nothing_and_names_the_element(client, other, name):
    a, b = name("a"), name("b")
    client.put_many({a: np.arange(3), b: np.arange(4)})
    missing = name("absent")
    with pytest.raises(tensord.NotFound) as e:
        other.get_many([a, missing, b])
    assert f"element 1 of 3 '{missing}'" in str(e.value)
    # The leases granted to the other elements went back.
    client.flush()
    other.flush()
    assert leases(client, a) == 0 and leases(client, b) == 0
    assert client.status()["leases"] == 0


def test_get_many_waits_for_every_name_at_once(client, other, name):
    early, late1, late2 = name("e"), name("l"), name("l")
    client.put(early, np.arange(2))
    timer = threading.Timer(0.3, lambda: other.put_many({late1: np.ones(2), late2: np.zeros(2)}))
    timer.start()
    try:
        got = client.get_many([late2, early, late1], timeout=10.0)
    finally:
        timer.join()
    assert [g.name for g in got] == [late2, early, late1]
    assert got[0].numpy().tolist() == [0.0, 0.0]
    # Absent names time out together: the batch takes about one timeout, not one each.
    start = time.monotonic()
    with pytest.raises(tensord.Timeout) as e:
        client.get_many([early] + [name("never") for _ in range(4)], timeout=0.5)
    elapsed = time.monotonic() - start
    assert 0.45 <= elapsed < 1.5, elapsed
    assert "element 1 of 5" in str(e.value)
    assert e.value.message.startswith("the batch of 5 names did not arrive within 0.5 s: acquire element 1 of 5")
    # One wait at the broker for the whole timeout: the element's reason states the caller's.
    assert "within 500 ms" in e.value.message
    client.flush()
    assert leases(other, early) == 1  # only got[1] holds one


def test_get_many_readonly_and_min_generation(client, other, name):
    n = name()
    client.put(n, np.arange(4, dtype=np.int32))
    client.put(n, np.arange(4, dtype=np.int32) * 2)
    (t,) = other.get_many([n], min_generation=2, readonly=True)
    assert t.readonly and t.generation == 2
    assert t.numpy().tolist() == [0, 2, 4, 6] and not t.numpy().flags.writeable
    with pytest.raises(tensord.Timeout):
        other.get_many([n], timeout=0.2, min_generation=3)
    with pytest.raises(TypeError, match="get_many takes names"):
        other.get_many([n, t.tensor_id])


def test_put_many_that_cannot_allocate_publishes_nothing(client, name):
    good = name("g")
    # Over the broker's host memory limit: a petabyte of one repeated byte (stride 0).
    huge = np.broadcast_to(np.zeros(1, dtype=np.uint8), (1 << 50,))
    with pytest.raises(tensord.ResourceExhausted) as e:
        client.put_many([(good, np.zeros(2)), (name("huge"), huge)])
    assert "allocate element 1 of 2" in str(e.value)
    with pytest.raises(tensord.InvalidArgument) as e:
        client.put_many([(good, np.zeros(2)), ("bad ns!/x", np.zeros(2))])
    assert "allocate element 1 of 2 in 'bad ns!'" in str(e.value)
    with pytest.raises(tensord.NotFound):
        client.get(good)
    client.flush()
    assert client.status()["tensors"] == 0


def test_put_many_that_cannot_publish_names_the_element(client, name):
    taken, first, last = name("t"), name("f"), name("l")
    client.put(taken, np.arange(2))
    with pytest.raises(tensord.Error) as e:
        client.put_many([(first, np.ones(1)), (taken, np.ones(1)), (last, np.ones(1))],
                        if_absent=True)
    assert e.value.code == "ALREADY_EXISTS"
    assert "publish element 1 of 3" in str(e.value) and taken in str(e.value)
    assert "2 elements of the batch were published" in str(e.value)
    # The others stick; the bound name kept its tensor.
    assert client.get(first).numpy().tolist() == [1.0]
    assert client.get(last).numpy().tolist() == [1.0]
    assert client.get(taken).numpy().tolist() == [0, 1]


def test_a_stream_of_small_tensors_maps_their_arena_once(client, other, name):
    first = [name("a") for _ in range(3)]
    # The first one makes the arena (one at a time: allocations in flight together may each
    # make one); the others land in it.
    infos = [client.put(first[0], np.full(16, 0, dtype=np.float32))]
    infos += client.put_many({n: np.full(16, k, dtype=np.float32) for k, n in enumerate(first)
                              if k > 0})
    assert all(i["arena"] for i in infos), "small tensors in one namespace should share an arena"
    arena = infos[0]["buffer_id"]
    assert all(i["buffer_id"] == arena for i in infos)

    def base(t):  # where the tensor's buffer starts in this process
        return t._data_ptr - t.info["buffer_offset"] - t.info["byte_offset"]

    got = other.get_many(first)
    assert [t.numpy()[0] for t in got] == [0.0, 1.0, 2.0]
    bases = {base(t) for t in got}
    assert len(bases) == 1, "one arena, one mapping"
    for t in got:
        t.release()
    del got
    other.flush()
    # A fresh tensor in the same arena, after the last lease on it went: the reader's
    # mapping lingered, so it lands at the same place without a new mapping.
    fresh = name("a")
    info = client.put(fresh, np.full(16, 7, dtype=np.float32))
    assert info["buffer_id"] == arena
    t = other.get(fresh)
    assert t.numpy()[0] == 7.0
    assert base(t) in bases


def test_in_place_writes_to_an_arena_tensor_stay_with_it(client, other, name):
    keep, old = name("k"), name("o")
    client.put(keep, np.ones(16, dtype=np.float32))
    client.put(old, np.full(16, 2, dtype=np.float32))
    held = other.get(keep)  # keeps the reader's arena mapping alive
    t = other.get(old)
    assert t.info["arena"]
    slot = (t.info["buffer_id"], t.info["buffer_offset"])
    x = torch.from_dlpack(t)
    x.add_(100)  # copy-on-write: this process's pages only
    assert client.get(old).numpy()[0] == 2.0
    del x
    t.release()
    other.flush()
    client.flush()
    client.delete(old)  # no binding, no lease: the slot is free
    fresh = name("f")
    # put_many: the broker places it (put() may take a slot its client allocated ahead).
    (info,) = client.put_many({fresh: np.full(16, 5, dtype=np.float32)})
    assert (info["buffer_id"], info["buffer_offset"]) == slot, "the broker did not reuse the slot"
    assert other.get(fresh).numpy().tolist() == [5.0] * 16
    assert held.numpy()[0] == 1.0


def test_take_many_is_a_batch_from_a_work_queue(client, other, name):
    prefix = name("q") + "/"
    client.put_many({f"{prefix}{i:02d}": np.full(4, i, dtype=np.int32) for i in range(5)})
    first = other.take_many(prefix, 3)
    assert [t.numpy()[0] for t in first] == [0, 1, 2]  # oldest first
    rest = other.take_many(prefix, 10, timeout=5.0)  # what is there; no wait for more
    assert [t.numpy()[0] for t in rest] == [3, 4]
    assert client.list(prefix) == []
    with pytest.raises(tensord.NotFound):
        other.take_many(prefix, 2)
    with pytest.raises(tensord.Timeout):
        other.take_many(prefix, 2, timeout=0.05)

    def later():
        time.sleep(0.1)
        client.put(prefix + "late", np.array([7], dtype=np.int32))

    thread = threading.Thread(target=later)
    thread.start()
    waited = other.take_many(prefix, 4, timeout=10.0)
    thread.join()
    assert [t.numpy().tolist() for t in waited] == [[7]]
    with pytest.raises(tensord.InvalidArgument):
        other.take_many(prefix, 0)
