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
