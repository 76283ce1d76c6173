"""A Client pickles as its connection settings, for spawn and forkserver workers, queues and
Datasets; the copy connects on its first call."""

import multiprocessing
import pickle

import numpy as np
import pytest

import mp_workers
import tensord


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


def test_a_tensor_refuses_pickling_saying_what_to_send_instead(client, name):
    n = name()
    client.put(n, np.arange(3))
    t = client.get(n)
    with pytest.raises(TypeError, match="Send its name or tensor_id and get\\(\\) it in the receiver"):
        pickle.dumps(t)
    assert pickle.loads(pickle.dumps((client, n, t.tensor_id)))[0].get(t.tensor_id).numpy().tolist() == [0, 1, 2]
