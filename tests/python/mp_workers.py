"""Targets for the multiprocessing tests (test_pickle.py): a spawned or forkserver child
imports them from here, since it cannot import a test module's locals."""

import numpy as np


def put_from_child(client, name, results):
    """Uses a client that came pickled (spawn, forkserver) or inherited (fork)."""
    client.put(name, np.arange(6, dtype=np.int32) * 7)
    results.put((client.session_id, client.get(name).numpy().tolist()))


def client_from_queue(clients, name, results):
    client = clients.get(timeout=60)
    client.put(name, np.full(3, 5, dtype=np.float32))
    results.put(client.session_id)


def send_tensors(client, prefix, count, results):
    """Publishes `count` unnamed tensors, puts each in `results` (pickled: a hand-over), and
    returns (so exits) without waiting for anyone to take them."""
    for i in range(count):
        t = client.empty((8,), "float32")
        t.numpy()[:] = float(i)
        client.publish(t, "")
        results.put(t)
    results.close()
    results.join_thread()  # every token is made and sent before this process goes


def sum_received(conn):
    t = conn.recv()
    conn.send(float(t.numpy().sum()))


def as_is(item):
    """A collate_fn that leaves an item alone (module level, so spawned workers find it)."""
    return item


class TensordLeases:
    """A map-style dataset whose items are tensord Tensors: each goes back to the DataLoader's
    main process as a hand-over, no copy."""

    def __init__(self, client, names):
        self.client, self.names = client, names

    def __len__(self):
        return len(self.names)

    def __getitem__(self, index):
        return self.client.get(self.names[index])


class TensordDataset:
    """A map-style dataset whose items are tensors in the broker: a DataLoader worker gets
    the client by pickling (spawn) and reads each item zero-copy."""

    def __init__(self, client, names):
        self.client, self.names = client, names

    def __len__(self):
        return len(self.names)

    def __getitem__(self, index):
        t = self.client.get(self.names[index])
        return t.torch().clone()  # DataLoader sends it back through its own shared memory


class Samples:
    """Image-like samples with a label, an id and a dict of extras, deterministic per index."""

    def __len__(self):
        return 10

    def __getitem__(self, index):
        import torch

        image = torch.full((3, 4, 4), float(index))
        return image, index, f"s{index}", {"mask": np.full(5, index % 2 == 0), "weight": 0.5 * index}
