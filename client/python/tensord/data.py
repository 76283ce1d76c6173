"""torch DataLoader batches built in broker memory.

A DataLoader's workers collate each batch into memory of their own, and torch copies it
again to send it to the training loop. With these two, the workers stack each batch straight
into broker memory (recycled buffers, so steady batches reuse memory already mapped) and
send the training loop only the batch's names; the loop takes the batch, zero-copy:

    client = tensord.connect()
    loader = DataLoader(dataset, batch_size=64, num_workers=4,
                        collate_fn=tensord.data.CollateIntoBroker(client, "train/batches"))
    for images, labels in tensord.data.taken(loader, client):
        ...                                   # torch tensors over broker memory

A batch keeps the structure of its samples (a tensor, numpy array or number per sample; or
tuples, lists and dicts of those). Tensors and arrays are stacked into one broker tensor per
field; numbers become a small torch tensor sent as they are; other values (strings) a list.
Works with every start method: the collate function carries the client by pickling (spawn,
forkserver) or inheritance (fork).
"""

import itertools
import os

from ._client import dtype_name

__all__ = ["CollateIntoBroker", "Batch", "taken"]


class _Taken:
    """A stacked field of a batch: the name its tensor was published under."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return (_Taken, (self.name,))


class Batch:
    """What a worker's collate function gives the DataLoader: the batch's structure with the
    names of its broker tensors in place of the stacked fields. take(client) makes it the
    batch again, each field a torch tensor over broker memory (taken: unbound, leased)."""

    __slots__ = ("structure",)

    def __init__(self, structure):
        self.structure = structure

    def __reduce__(self):
        return (Batch, (self.structure,))

    def names(self):
        """The names of the batch's broker tensors."""
        found = []
        _walk(self.structure, lambda leaf: found.append(leaf.name) if isinstance(leaf, _Taken) else None)
        return found

    def take(self, client, timeout=60.0):
        """The batch, its stacked fields taken from the broker (zero-copy torch tensors)."""
        return _rebuild(self.structure, lambda leaf: client.take(leaf.name, timeout=timeout).torch()
                        if isinstance(leaf, _Taken) else leaf)


def _walk(value, visit):
    if isinstance(value, dict):
        for v in value.values():
            _walk(v, visit)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _walk(v, visit)
    else:
        visit(value)


def _rebuild(value, leaf):
    if isinstance(value, dict):
        return {k: _rebuild(v, leaf) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_rebuild(v, leaf) for v in value)
    if isinstance(value, list):
        return [_rebuild(v, leaf) for v in value]
    return leaf(value)


class CollateIntoBroker:
    """A DataLoader collate_fn that stacks each batch's tensors and arrays into broker
    tensors, published under prefix (names prefix/<pid>/<batch>/<field>), and returns a
    Batch of their names for the training loop to take (taken() does it). ns: the namespace
    the batches are allocated in (default: the prefix's first segment).

    A batch nobody takes does not outlive its worker: each is published with
    unbind_on_exit, so a loop broken early (the DataLoader then shuts its workers down) or a
    worker that dies leaves nothing bound. ttl (seconds, default None: none) also unbinds a
    batch not taken within that long, for persistent workers whose loop stopped."""

    def __init__(self, client, prefix, ns=None, ttl=None):
        if not prefix or prefix.endswith("/"):
            raise ValueError(f"prefix {prefix!r}: give a name prefix without a trailing '/'")
        self.client, self.prefix = client, prefix
        self.ns = ns or prefix.split("/", 1)[0]
        self.ttl = ttl
        self._batches = None
        self._pid = None

    def __getstate__(self):
        return {"client": self.client, "prefix": self.prefix, "ns": self.ns, "ttl": self.ttl}

    def __setstate__(self, state):
        self.__init__(state["client"], state["prefix"], state["ns"], state.get("ttl"))

    def __call__(self, samples):
        if self._pid != os.getpid():  # a new worker (forked or spawned): names of its own
            self._pid, self._batches = os.getpid(), itertools.count()
        base = f"{self.prefix}/{self._pid}/{next(self._batches)}"
        fields = itertools.count()
        return Batch(self._collate(list(samples), lambda: f"{base}/{next(fields)}"))

    def _collate(self, samples, next_name):
        import torch

        first = samples[0]
        if isinstance(first, dict):
            return {k: self._collate([s[k] for s in samples], next_name) for k in first}
        if isinstance(first, (tuple, list)):
            fields = [self._collate([s[i] for s in samples], next_name) for i in range(len(first))]
            return tuple(fields) if isinstance(first, tuple) else fields
        if isinstance(first, (bool, int, float)):
            return torch.tensor(samples)
        if not (isinstance(first, torch.Tensor) or hasattr(first, "__array_interface__")):
            return samples  # strings and the like, as DataLoader's default collate keeps them
        parts = [torch.as_tensor(s) for s in samples]
        t = self.client.empty((len(parts), *parts[0].shape), dtype_name(parts[0].dtype), ns=self.ns)
        torch.stack(parts, out=t.torch())
        name = next_name()
        self.client.publish(t, name, ttl=self.ttl, unbind_on_exit=True)
        t.release()
        return _Taken(name)


def taken(loader, client, timeout=60.0):
    """The batches of a DataLoader whose collate_fn is a CollateIntoBroker, taken from the
    broker: each as its samples' structure, the stacked fields torch tensors over broker
    memory (each holds its lease until it is garbage-collected)."""
    for batch in loader:
        yield batch.take(client, timeout=timeout) if isinstance(batch, Batch) else batch
