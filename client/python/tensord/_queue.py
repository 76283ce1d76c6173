"""Bounded work queues: what Client.queue() returns."""

from ._client import _NO_STREAM, _shape, _tags, _torch_stream, device_tuple, dtype_name, source_of


class Queue:
    """A bounded work queue under a prefix ending in '/', as queue.Queue(maxsize) bounds one,
    shared by every process that names the prefix: producers wait while it is full, consumers
    take the oldest tensor.

    A tensor is in the queue from its allocation (empty(), put()) until a consumer takes it,
    or until it goes without being published. While `depth` tensors are in the queue,
    empty() and put() wait (timeout: None waits forever, 0 fails at once with
    ResourceExhausted, a positive number of seconds raises Timeout; Ctrl-C interrupts), the
    oldest waiting producer first; nothing is allocated for a producer that waits. The
    tensors are allocated in the prefix's namespace, so a taken and released tensor's buffer
    is recycled into the producer's next one, already mapped on both sides: a steady queue
    costs no new memory.

    Consumers need no depth: client.queue(prefix).get() takes the oldest tensor, waiting as
    take() does, and iterating over the queue takes one tensor after another.
    """

    def __init__(self, client, prefix, depth=None):
        if not isinstance(prefix, str) or not prefix.endswith("/"):
            raise ValueError(f"a queue is a prefix ending in '/', not {prefix!r}")
        if depth is not None and not 1 <= int(depth) <= 65536:
            raise ValueError(f"depth: between 1 and 65536, not {depth!r}")
        self.client = client
        self.prefix = prefix
        self.depth = None if depth is None else int(depth)

    def __repr__(self):
        return f"tensord.Queue({self.prefix!r}, depth={self.depth})"

    def _depth(self, what):
        if self.depth is None:
            raise ValueError(f"{what}: this queue was made without a depth; producers give one "
                             f"(client.queue({self.prefix!r}, depth=N))")
        return self.depth

    # Producing.

    def empty(self, shape, dtype, device=None, tags=None, timeout=None):
        """A writable tensor in the queue, once there is room: fill it in place, then
        publish() it. device and tags as for Client.empty()."""
        return self._empty(shape, dtype, device, tags, timeout, None)

    def _empty(self, shape, dtype, device, tags, timeout, cancel):
        """empty() whose wait a _CancelToken may end (tensord.aio's); cancel may be None."""
        return self.client._core.empty_in_queue(self.prefix, self._depth("empty"), _shape(shape), dtype_name(dtype),
                                                device_tuple(device), _tags(tags), timeout, cancel)

    def publish(self, t, stream=None, ttl=None, tags=None, wait=True, unbind_on_exit=False):
        """Publishes a tensor from this queue's empty() under the prefix, with a name of its
        own (the prefix and the tensor's id); consumers take it oldest first. stream, ttl,
        tags, wait and unbind_on_exit as for Client.publish(). Returns its description
        (None with wait=False)."""
        if stream == -1:
            stream = _NO_STREAM
        return self.client._core.publish_in_queue(t, self.prefix, ttl, stream, _tags(tags), wait, unbind_on_exit)

    def put(self, obj, stream=None, ttl=None, tags=None, timeout=None, unbind_on_exit=False):
        """Copies any array into the queue once there is room (what Client.put() reads,
        a torch CUDA tensor device to device on its stream) and publishes it. ttl, tags and
        unbind_on_exit as for Client.publish(). Returns its description."""
        return self._put(obj, stream, ttl, tags, timeout, None, unbind_on_exit)

    def _put(self, obj, stream, ttl, tags, timeout, cancel, unbind_on_exit=False):
        """put() whose wait a _CancelToken may end; cancel may be None."""
        if stream == -1:
            raise ValueError("put copies on a stream and publishes after it: pass that stream (or None), not -1")
        if stream is None:
            stream = _torch_stream(obj)
        return self.client._core.put_in_queue(self.prefix, self._depth("put"), source_of(obj), ttl, stream,
                                              _tags(tags), timeout, cancel, unbind_on_exit)

    # Consuming.

    def get(self, timeout=None, pinned=False, readonly=False):
        """Takes the oldest tensor in the queue, which frees its slot. timeout as for
        Client.take(), but waiting forever by default; pinned and readonly as for take()."""
        return self.client.take(self.prefix, timeout, pinned, readonly)

    def __iter__(self):
        """Takes one tensor after another, waiting for each; break out of the loop to stop."""
        while True:
            yield self.get()

    # What it holds.

    def stats(self):
        """The queue as the broker counts it: a dict with 'depth', 'slots_held' (tensors in
        the queue: being written, or published and not taken), 'published' (waiting for a
        taker), 'producers_waiting' and 'takers_waiting'. All 0 for a queue the broker has
        forgotten (nothing in it, nobody waiting)."""
        for queue in self.client.status(queues=True)["queues"]:
            if queue["prefix"] == self.prefix:
                return queue
        return {"prefix": self.prefix, "depth": 0, "slots_held": 0, "published": 0, "producers_waiting": 0,
                "takers_waiting": 0}

    def qsize(self):
        """How many tensors are published in the queue and not taken yet."""
        return self.stats()["published"]
