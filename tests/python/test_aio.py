"""tensord.aio: the client's calls as coroutines, waits that leave the event loop free and
stop when cancelled, async iteration over a watch and a work queue."""

import asyncio
import time

import numpy as np
import pytest

import tensord
import tensord.aio


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def test_a_get_waits_without_blocking_the_loop(broker, name):
    n = name()

    async def main():
        client = await tensord.aio.connect(broker.socket, lease_cache=False)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        clock = asyncio.create_task(ticker())
        waiting = asyncio.create_task(client.get(n, timeout=10))
        await asyncio.sleep(0.5)
        assert not waiting.done() and ticks >= 5  # the loop ran while the get waited
        await client.put(n, np.arange(4))
        t = await waiting
        clock.cancel()
        assert t.numpy().tolist() == [0, 1, 2, 3]
        await client.close()

    run(main())


def test_a_timeout_is_the_callers_and_a_timeout_error(broker, name):
    async def main():
        async with await tensord.aio.connect(broker.socket) as client:
            start = time.monotonic()
            with pytest.raises(TimeoutError, match="did not arrive within 0.6 s") as e:
                await client.get(name(), timeout=0.6)
            # The caller's own timeout, not given up early (no upper bound: a loaded machine
            # may answer late).
            assert isinstance(e.value, tensord.Timeout)
            assert time.monotonic() - start >= 0.55
            with pytest.raises(tensord.NotFound):  # timeout 0 looks once: no wait to time out
                await client.take(name(), timeout=0)

    run(main())


def test_a_cancelled_take_takes_nothing_after_it_stops(broker, client, name):
    q = name("q") + "/"

    async def main():
        aclient = tensord.aio.AsyncClient(client)
        task = asyncio.create_task(aclient.take(q, timeout=None))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.5)  # several wait slices (0.25 s): the thread has stopped waiting
        await aclient.put(q + "0", np.ones(2))
        await asyncio.sleep(0.3)
        assert [e["name"] for e in await aclient.list(q)] == [q + "0"]  # still there

    run(main())


def test_async_for_over_a_work_queue_and_a_watch(broker, client, name):
    q = name("work") + "/"

    async def main():
        aclient = tensord.aio.AsyncClient(client)
        async with aclient.watch(q) as events:
            for i in range(3):
                await aclient.put(f"{q}{i:02d}", np.full(2, i))
            kinds = []
            async for event in events:
                kinds.append((event["kind"], event["name"]))
                if len(kinds) == 3:
                    break
            assert kinds == [("bound", f"{q}{i:02d}") for i in range(3)]
            taken = []
            async for t in aclient.queue(q, readonly=True):
                assert t.readonly
                taken.append(int(t.numpy()[0]))
                if len(taken) == 3:
                    break
            assert taken == [0, 1, 2]
            assert await events.next(timeout=5) is not None  # the takes unbound them
        assert await aclient.list(q) == []

    run(main())
