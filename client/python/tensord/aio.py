"""tensord for asyncio (an inference server's event loop): the Client's calls as coroutines,
and async iteration over a watch or a work queue.

    client = await tensord.aio.connect()
    t = await client.get("models/weights", timeout=None)      # the loop runs on meanwhile
    async for request in client.queue("infer/requests/"):      # take()s them, oldest first
        ...
    q = client.queue("infer/results/", depth=8)                # bounded: put() waits for room
    await q.put(result)
    async for event in client.watch("models/"):
        ...

Each call runs on a worker thread (asyncio.to_thread). A wait is one request to the broker
for the whole timeout, as in the blocking API (0: at once, None: forever); cancelling the
coroutine cancels that wait at the broker, and the coroutine ends once the broker has dropped
it, so a cancelled take takes nothing after it stops (one whose grant raced the cancel is
released). A watch's next() waits in slices of at most 0.25 s on its thread.
"""

import asyncio
import time

from ._client import connect as _connect
from ._tensord import _CancelToken

__all__ = ["AsyncClient", "AsyncQueue", "AsyncWatch", "connect"]

_SLICE = 0.25  # seconds: how long a cancelled watch's next() may go on in its thread


async def connect(socket=None, **kwargs):
    """tensord.connect() on a worker thread: an AsyncClient."""
    return AsyncClient(await asyncio.to_thread(_connect, socket, **kwargs))


async def _waiting(call, timeout):
    """call(timeout, cancel_token) on a worker thread: one wait at the broker, which a
    cancelled coroutine cancels there before it re-raises CancelledError."""
    if timeout is not None and timeout <= 0:
        return await asyncio.to_thread(call, 0.0, None)
    token = _CancelToken()
    waiting = asyncio.ensure_future(asyncio.to_thread(call, timeout, token))
    try:
        return await asyncio.shield(waiting)
    except asyncio.CancelledError:
        token.cancel()
        # The broker answers a cancelled wait at once (the call then raises Cancelled, and a
        # grant that raced the cancel is released): wait for that, so nothing is taken after.
        await asyncio.wait([waiting])
        if not waiting.cancelled():
            waiting.exception()  # the expected Cancelled: retrieved, so asyncio does not log it
        raise


class AsyncClient:
    """A Client whose calls are coroutines (see the module's docstring). .client is the
    blocking Client underneath, for what has no coroutine here."""

    def __init__(self, client):
        self.client = client

    async def get(self, name, timeout=0.0, min_generation=None, readonly=False, pinned=False):
        """As Client.get; waits without blocking the event loop."""
        return await _waiting(lambda t, c: self.client._get(name, t, min_generation, readonly, pinned, c), timeout)

    async def get_many(self, names, timeout=0.0, min_generation=None, readonly=False, pinned=False):
        """As Client.get_many."""
        names = list(names)  # read now, on the event loop, not later on the worker thread
        return await _waiting(lambda t, c: self.client._get_many(names, t, min_generation, readonly, pinned, c),
                              timeout)

    async def take(self, name_or_prefix, timeout=0.0, pinned=False, readonly=False):
        """As Client.take: a cancelled take takes nothing after it stops waiting."""
        return await _waiting(lambda t, c: self.client._core.take(name_or_prefix, t, pinned, readonly, c), timeout)

    async def take_many(self, name_or_prefix, max_count, timeout=0.0, pinned=False, readonly=False):
        """As Client.take_many."""
        return await _waiting(
            lambda t, c: self.client._core.take_many(name_or_prefix, max_count, t, pinned, readonly, c), timeout)

    async def put(self, name, obj, **kwargs):
        """As Client.put (the copy runs on the worker thread)."""
        return await asyncio.to_thread(lambda: self.client.put(name, obj, **kwargs))

    async def put_many(self, items, **kwargs):
        """As Client.put_many."""
        return await asyncio.to_thread(lambda: self.client.put_many(items, **kwargs))

    async def empty(self, shape, dtype, ns=None, device=None, tags=None):
        """As Client.empty."""
        return await asyncio.to_thread(self.client.empty, shape, dtype, ns, device, tags)

    async def publish(self, t, name, **kwargs):
        """As Client.publish."""
        return await asyncio.to_thread(lambda: self.client.publish(t, name, **kwargs))

    async def hand_over(self, t, ttl=None):
        """As Client.hand_over."""
        return await asyncio.to_thread(self.client.hand_over, t, ttl)

    async def redeem(self, token, readonly=False, pinned=False):
        """As Client.redeem."""
        return await asyncio.to_thread(self.client.redeem, token, readonly, pinned)

    async def cancel_hand_overs(self, tokens=None):
        """As Client.cancel_hand_overs."""
        return await asyncio.to_thread(self.client.cancel_hand_overs, tokens)

    async def delete(self, name, if_generation=None):
        """As Client.delete."""
        return await asyncio.to_thread(self.client.delete, name, if_generation)

    async def list(self, prefix=""):
        """As Client.list."""
        return await asyncio.to_thread(self.client.list, prefix)

    async def list_page(self, prefix="", page_token="", limit=0):
        """As Client.list_page."""
        return await asyncio.to_thread(self.client.list_page, prefix, page_token, limit)

    async def stat(self, name):
        """As Client.stat."""
        return await asyncio.to_thread(self.client.stat, name)

    async def status(self, sessions=False, queues=False):
        """As Client.status."""
        return await asyncio.to_thread(self.client.status, sessions, queues)

    async def flush(self):
        """As Client.flush."""
        return await asyncio.to_thread(self.client.flush)

    async def close(self):
        """As Client.close."""
        return await asyncio.to_thread(self.client.close)

    def watch(self, prefix="", initial=False):
        """An AsyncWatch of binding changes under prefix: `async for event in ...`."""
        return AsyncWatch(self.client.watch(prefix, initial))

    def queue(self, prefix, depth=None, pinned=False, readonly=False):
        """An AsyncQueue: the bounded work queue under prefix (Client.queue) with coroutines,
        and `async for t in client.queue(prefix)` takes the tensors published under prefix,
        oldest first, as they come (break out of it to stop). pinned and readonly are how
        iterating takes (as for take())."""
        return AsyncQueue(self.client.queue(prefix, depth), pinned, readonly)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class AsyncQueue:
    """A tensord.Queue whose waiting calls are coroutines: a cancelled empty() or put()
    allocates nothing after it stops waiting, and a cancelled get() takes nothing. .queue is
    the blocking Queue underneath."""

    def __init__(self, queue, pinned=False, readonly=False):
        self.queue = queue
        self._pinned = pinned
        self._readonly = readonly

    async def empty(self, shape, dtype, device=None, tags=None, timeout=None):
        """As Queue.empty."""
        return await _waiting(lambda t, c: self.queue._empty(shape, dtype, device, tags, t, c), timeout)

    async def put(self, obj, stream=None, ttl=None, tags=None, timeout=None, unbind_on_exit=False):
        """As Queue.put (the copy runs on the worker thread)."""
        return await _waiting(lambda t, c: self.queue._put(obj, stream, ttl, tags, t, c, unbind_on_exit), timeout)

    async def publish(self, t, **kwargs):
        """As Queue.publish."""
        return await asyncio.to_thread(lambda: self.queue.publish(t, **kwargs))

    async def get(self, timeout=None, pinned=None, readonly=None):
        """As Queue.get; pinned and readonly default to the queue's."""
        pinned = self._pinned if pinned is None else pinned
        readonly = self._readonly if readonly is None else readonly
        core = self.queue.client._core
        return await _waiting(lambda t, c: core.take(self.queue.prefix, t, pinned, readonly, c), timeout)

    async def __aiter__(self):
        while True:
            yield await self.get()

    async def stats(self):
        """As Queue.stats."""
        return await asyncio.to_thread(self.queue.stats)

    async def qsize(self):
        """As Queue.qsize."""
        return await asyncio.to_thread(self.queue.qsize)


class AsyncWatch:
    """A Watch for `async for`; close() (or leaving `async with`) ends it."""

    def __init__(self, watch):
        self._watch = watch
        self._closed = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self._closed:
            event = await asyncio.to_thread(self._watch.next, _SLICE)
            if event is not None:
                return event
        raise StopAsyncIteration

    async def next(self, timeout=None):
        """The next event within timeout seconds (None: forever); None when none came."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
            if left <= 0:
                return None
            event = await asyncio.to_thread(self._watch.next, left)
            if event is not None:
                return event
        return None

    def close(self):
        """Ends the watch."""
        self._closed = True
        self._watch.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()
