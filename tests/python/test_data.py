"""tensord.data: DataLoader workers stack batches into broker memory, the loop takes them."""

import pytest

import mp_workers
import tensord
import tensord.data

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_dataloader_batches_through_the_broker(client, method):
    collate = tensord.data.CollateIntoBroker(client, "py/dl")
    loader = torch.utils.data.DataLoader(mp_workers.Samples(), batch_size=4, num_workers=2,
                                         collate_fn=collate, multiprocessing_context=method)
    seen = []
    for images, labels, ids, extras in tensord.data.taken(loader, client):
        n = len(ids)
        assert images.shape == (n, 3, 4, 4) and images.dtype == torch.float32
        assert labels.tolist() == [int(i[1:]) for i in ids]
        assert torch.equal(images[:, 0, 0, 0], labels.float())
        assert extras["mask"].dtype == torch.bool and extras["mask"].shape == (n, 5)
        assert extras["mask"][:, 0].tolist() == [label % 2 == 0 for label in labels.tolist()]
        assert extras["weight"].tolist() == [0.5 * label for label in labels.tolist()]
        seen += labels.tolist()
    assert seen == list(range(10))  # every sample once, in the loader's order
    assert client.list("py/dl/") == []  # every batch was taken


def test_a_batch_names_its_tensors_and_takes_them(client):
    collate = tensord.data.CollateIntoBroker(client, "py/one")
    batch = collate([(torch.ones(2), 1), (torch.zeros(2), 2)])
    names = batch.names()
    assert len(names) == 1 and names[0].startswith("py/one/")
    assert [e["name"] for e in client.list("py/one/")] == names
    values, labels = batch.take(client)
    assert values.tolist() == [[1.0, 1.0], [0.0, 0.0]] and labels.tolist() == [1, 2]
    assert client.list("py/one/") == []
    with pytest.raises(ValueError, match="trailing"):
        tensord.data.CollateIntoBroker(client, "py/one/")


def test_a_loop_broken_early_leaves_no_batch_behind(client):
    from conftest import wait_for

    class Many(mp_workers.Samples):
        def __len__(self):
            return 400

    collate = tensord.data.CollateIntoBroker(client, "py/broken")
    loader = torch.utils.data.DataLoader(Many(), batch_size=4, num_workers=2, prefetch_factor=4,
                                         collate_fn=collate, multiprocessing_context="fork")
    batches = tensord.data.taken(loader, client)
    for _ in range(3):
        next(batches)
    # The workers prefetch batches the loop has not taken: what a broken loop leaves behind.
    wait_for(lambda: len(client.list("py/broken/")) > 0, what="prefetched batches")
    batches.close()  # the loop is left: the DataLoader iterator goes and shuts its workers down
    del batches
    wait_for(lambda: client.list("py/broken/") == [], timeout=20, what="the untaken batches to be unbound")


def test_a_batch_of_a_dead_worker_is_unbound_and_one_already_taken_stays_good(broker, client):
    import os
    import signal
    import subprocess

    from conftest import wait_for

    code = ("import os, signal, sys, torch, tensord, tensord.data\n"
            "c = tensord.connect()\n"
            "collate = tensord.data.CollateIntoBroker(c, 'py/dead')\n"
            "for i in range(3): print(*collate([(torch.full((2,), float(i)), i)]).names(), flush=True)\n"
            "sys.stdin.readline(); os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.Popen([os.sys.executable, "-c", code], env=broker.env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        names = [proc.stdout.readline().strip() for _ in range(3)]
        taken = client.take(names[0])
        assert len(client.list("py/dead/")) == 2
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: client.list("py/dead/") == [], what="the dead worker's batches to be unbound")
    assert taken.numpy().tolist() == [[0.0, 0.0]]  # a batch of one sample
