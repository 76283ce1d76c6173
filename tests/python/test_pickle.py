"""A Client pickles as its connection settings, for spawn and forkserver workers, queues and
Datasets; the copy connects on its first call. A Tensor pickles as a hand-over token that the
receiver redeems for a zero-copy lease of its own."""

import multiprocessing
import os
import pickle

import numpy as np
import pytest

import mp_workers
import tensord
from conftest import wait_for


def test_a_client_pickles_as_its_settings_and_connects_on_first_use(client, name):
    copy = pickle.loads(pickle.dumps(client))
    assert copy.socket == client.socket
    assert repr(copy) == f"<tensord.Client socket={client.socket!r} not connected yet>"
    assert not copy.closed
    n = name()
    copy.put(n, np.arange(4, dtype=np.int64))
    assert client.get(n).numpy().tolist() == [0, 1, 2, 3]
    assert copy.session_id != client.session_id
    assert f"session={copy.session_id}" in repr(copy)
    copy.close()
    assert copy.closed


def test_a_copy_whose_broker_is_gone_fails_on_its_first_call_not_on_unpickling(broker, client):
    data = pickle.dumps(client)
    broker.stop()
    copy = pickle.loads(data)
    with pytest.raises(tensord.Unavailable, match="t.sock"):
        copy.list()


def test_a_copy_closed_before_use_never_connects(client):
    copy = pickle.loads(pickle.dumps(client))
    copy.close()
    assert copy.closed and repr(copy) == "<tensord.Client closed>"
    with pytest.raises(ValueError, match="closed"):
        copy.list()


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_a_child_uses_the_client_it_was_given(client, name, method):
    ctx = multiprocessing.get_context(method)
    results = ctx.Queue()
    n = name(method)
    child = ctx.Process(target=mp_workers.put_from_child, args=(client, n, results))
    child.start()
    session, values = results.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0
    assert values == [0, 7, 14, 21, 28, 35]
    assert session != client.session_id  # its own session, never the parent's
    assert client.get(n).numpy().tolist() == values


def test_a_client_goes_through_a_queue(client, name):
    ctx = multiprocessing.get_context("spawn")
    clients, results = ctx.Queue(), ctx.Queue()
    n = name()
    child = ctx.Process(target=mp_workers.client_from_queue, args=(clients, n, results))
    child.start()
    clients.put(client)
    assert results.get(timeout=120) != client.session_id
    child.join(60)
    assert child.exitcode == 0
    assert client.get(n).numpy().tolist() == [5.0, 5.0, 5.0]


def test_a_dataset_holding_a_client_works_in_spawned_dataloader_workers(client, name):
    torch = pytest.importorskip("torch")
    names = [name("ds") for _ in range(6)]
    for i, n in enumerate(names):
        client.put(n, torch.full((2, 3), float(i)))

    loader = torch.utils.data.DataLoader(mp_workers.TensordDataset(client, names), batch_size=None,
                                         num_workers=2, multiprocessing_context="spawn")
    got = [batch[0, 0].item() for batch in loader]
    assert got == [float(i) for i in range(6)]


def test_a_pickled_tensor_is_a_hand_over_redeemed_as_a_lease_of_its_own(client, name):
    n = name()
    client.put(n, np.arange(5, dtype=np.int32))
    t = client.get(n)
    data = pickle.dumps(t)
    assert client.status()["hand_overs_pending"] == 1
    copy = pickle.loads(data)
    assert isinstance(copy, tensord.Tensor)
    assert copy.tensor_id == t.tensor_id and copy.numpy().tolist() == [0, 1, 2, 3, 4]
    assert client.status()["hand_overs_pending"] == 0
    with pytest.raises(tensord.NotFound, match="redeemed already"):
        pickle.loads(data)  # a token is good once
    readonly = pickle.loads(pickle.dumps(client.get(n, readonly=True)))
    assert readonly.readonly


def test_a_sender_may_let_go_at_once_the_token_holds_the_tensor(client, name):
    n = name()
    client.put(n, np.full(4, 3.0, dtype=np.float32))
    t = client.take(n)  # unbound: only leases, and now the token, keep it
    data = pickle.dumps(t)
    t.release()
    client.flush()
    assert pickle.loads(data).numpy().tolist() == [3.0] * 4


def test_a_hand_over_nobody_redeems_expires_leaving_nothing(client, name):
    n = name()
    client.put(n, np.zeros(1 << 20, dtype=np.float32))  # 4 MiB, a buffer of its own
    t = client.take(n)
    tensors = client.status()["tensors"]
    token = client.hand_over(t, ttl=0.2)
    t.release()
    client.flush()
    wait_for(lambda: client.status()["tensors"] == tensors - 1, what="the handed-over tensor dropped")
    assert client.status()["hand_overs_pending"] == 0
    with pytest.raises(tensord.NotFound):
        client.redeem(token)


def test_a_maker_cancels_its_hand_overs_and_the_memory_they_pinned_goes(client, name):
    first, second = name(), name()
    client.put(first, np.zeros(1 << 20, dtype=np.float32))  # 4 MiB, a buffer of its own
    client.put(second, np.zeros(1 << 20, dtype=np.float32))
    a, b = client.take(first), client.take(second)
    tensors = client.status()["tensors"]
    one = client.hand_over(a, ttl=3600)
    again = client.hand_over(a, ttl=3600)  # the same memory: pinned once
    other = client.hand_over(b, ttl=3600)
    a.release()
    b.release()
    client.flush()
    (pins,) = [p for p in client.status()["hand_over_pins"] if p["uid"] == os.getuid()]
    assert pins["hand_overs"] == 3
    assert pins["host_bytes"] >= 2 * (4 << 20)
    assert pins["host_bytes"] < 3 * (4 << 20)

    assert client.cancel_hand_overs([one, "not-a-token"]) == 1
    assert client.cancel_hand_overs([]) == 0  # names no token: cancels nothing
    with pytest.raises(tensord.NotFound):
        client.redeem(one)
    assert client.status()["tensors"] == tensors, "the second token still holds the first tensor"
    assert client.cancel_hand_overs() == 2  # every one left
    assert client.status()["tensors"] == tensors - 2
    assert client.status()["hand_overs_pending"] == 0
    assert all(p["uid"] != os.getuid() for p in client.status()["hand_over_pins"])
    with pytest.raises(tensord.NotFound):
        client.redeem(other)
    with pytest.raises(tensord.NotFound):
        client.redeem(again)


def test_handing_over_needs_a_published_tensor_and_a_sane_ttl(client):
    t = client.empty((4,), "float32")
    with pytest.raises(tensord.Error, match="not published yet"):
        pickle.dumps(t)
    client.publish(t, "")  # unnamed is enough
    assert pickle.loads(pickle.dumps(t)).shape == (4,)
    with pytest.raises(ValueError, match="ttl"):
        client.hand_over(t, ttl=7200)
    t.release()
    with pytest.raises(ValueError, match="released"):
        pickle.dumps(t)


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_a_worker_sends_tensors_through_a_queue_and_exits(client, name, method):
    ctx = multiprocessing.get_context(method)
    results = ctx.Queue()
    prefix = name(method) + "/"
    child = ctx.Process(target=mp_workers.send_tensors, args=(client, prefix, 3, results))
    child.start()
    got = [results.get(timeout=120) for _ in range(3)]
    child.join(60)
    assert child.exitcode == 0  # gone: the tokens held the tensors
    assert [t.numpy().tolist() for t in got] == [[float(i)] * 8 for i in range(3)]
    assert all(t.name is None for t in got)  # unnamed: reachable only through the token
    assert client.status()["hand_overs_pending"] == 0


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_taken_batch_goes_to_a_worker_through_a_pipe(client, name, method):
    ctx = multiprocessing.get_context(method)
    ours, theirs = ctx.Pipe()
    n = name(method)
    client.put(n, np.arange(10, dtype=np.float64))
    child = ctx.Process(target=mp_workers.sum_received, args=(theirs,))
    child.start()
    batch = client.take(n)
    ours.send(batch)
    del batch  # the token holds it; nothing here does
    assert ours.recv() == 45.0
    child.join(60)
    assert child.exitcode == 0


def test_tensors_go_through_torch_multiprocessing_queues(client, name):
    torch_mp = pytest.importorskip("torch.multiprocessing")
    ctx = torch_mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=mp_workers.send_tensors, args=(client, name() + "/", 2, results))
    child.start()
    got = [results.get(timeout=120) for _ in range(2)]
    child.join(60)
    assert [t.torch().sum().item() for t in got] == [0.0, 8.0]


def test_spawned_dataloader_workers_return_tensord_tensors(client, name):
    torch = pytest.importorskip("torch")
    names = [name("ds") for _ in range(4)]
    for i, n in enumerate(names):
        client.put(n, torch.full((2, 3), float(i)))
    dataset = mp_workers.TensordLeases(client, names)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn", collate_fn=mp_workers.as_is)
    got = [t.torch()[1, 2].item() for t in loader]
    assert got == [float(i) for i in range(4)]
