"""The worker processes of compare.py: producers and consumers of every peer.

Every experiment runs in forked processes (the driver itself never connects to anything,
so nothing of gRPC or of a tensord session is alive across a fork). A worker sets up (its
connection, its server), waits on a barrier with the others, records its start time, does
its work, and puts one result tuple on the `results` queue:
("ok", role, index, start, end, count, checksum, samples_ns) or ("error", role, index,
traceback). Times are time.monotonic() (CLOCK_MONOTONIC: one clock for every process).

The touch, the same for every peer: a handoff consumer reads one byte in every 4 KiB page
(numpy strided sum over a uint8 view), so every page of the tensor is mapped and faulted
in but nothing is copied in bulk; a repeated-read consumer sums the first 64 bytes.

Flow control, the same for every handoff peer: at most `window` items in flight per
consumer (torch's Queue(maxsize) is a BoundedSemaphore; the tensord peers use a semaphore
of the same size; the floor has `window` slots per consumer; gRPC calls are synchronous,
one in flight per producer).
"""

import os
import threading
import time
import traceback

import numpy

PAGE = 4096


# TENSORD_BENCH_READ_ALL=1 (default_path.py --read-all): every consumer also reads every byte
# (a max over the array), as a consumer that uses the whole tensor does.
READ_ALL = os.environ.get("TENSORD_BENCH_READ_ALL") == "1"


def touch_pages(array):
    """One byte per 4 KiB page of a uint8 array, summed (every byte read first with READ_ALL)."""
    if READ_ALL:
        array.max()
    return int(array[::PAGE].sum())


def touch_head(array):
    """The sum of the first 64 bytes."""
    return int(array[:64].sum())


def run_worker(results, barrier, role, index, body):
    """Runs body(start) -> (count, checksum, samples_ns) after the barrier and reports."""
    try:
        prepared = body()  # setup before the barrier; returns the timed part
        barrier.wait()
        start = time.monotonic()
        count, checksum, samples = prepared(start)
        end = time.monotonic()
        results.put(("ok", role, index, start, end, count, checksum, samples))
    except BaseException:  # noqa: B036 - reported to the driver, which fails the run
        results.put(("error", role, index, traceback.format_exc()))
        try:
            barrier.abort()
        except Exception:
            pass


# ---- routing: which consumer gets which item ----

def consumer_of(producer, item, consumers):
    return (producer + item) % consumers


def items_for(consumer, producers, consumers, per_producer):
    """[(producer, item)] that `consumer` receives, in each producer's order."""
    return [(p, i) for p in range(producers) for i in range(per_producer)
            if consumer_of(p, i, consumers) == consumer]


WARM_SIZE = 64

# ---- warm-up: before the clock starts, each consumer receives cfg["warm"] tensors of
# cfg["warm_size"] bytes from each producer the way the peer hands tensors over, so
# connections, sessions, streams and torch's shm manager are set up outside the timed part.
# compare.py asks for one small tensor at 4 KiB, and for `window` tensors of the run's size
# for large tensors: the state of a producer that has been running (for tensord, its
# recycled buffers; torch.mp makes new shared memory per tensor whatever came before) ----

def tensord_warm_producer(client, cfg, index):
    # The producer holds every warm tensor until the last is published, so they are all alive
    # at once whatever the consumers' pace, and as many recycled buffers as that go back to its
    # pool (the single handoffs of large tensors warm up with their own loop instead, below).
    held = []
    for c in range(cfg["consumers"]):
        for k in range(cfg["warm"]):
            t = client.empty((cfg["warm_size"],), "uint8", ns=cfg["ns"])
            t.numpy().fill(0)
            client.publish(t, f"{cfg['prefix']}/w/c{c}/p{index}/{k}")
            held.append(t)
    for t in held:
        t.release()


def tensord_warm_consumer(client, cfg, index):
    for _ in range(cfg["producers"] * cfg["warm"]):
        client.take(f"{cfg['prefix']}/w/c{index}/", timeout=60.0).release()


# ---- tensord, single: empty(ns) + fill + publish; the consumer takes from its prefix ----

# Large tensors warm up with the timed loop itself, cfg["warm_loop"] tensors per producer under
# other names: a producer that has been running has made every buffer it cycles through,
# filled it, and each consumer has mapped each of them, which a short timed run would
# otherwise pay for inside the clock.

def tensord_single_producer(cfg, index, slots):
    import tensord

    def setup():
        if cfg.get("ahead"):
            client = tensord.connect(cfg["socket"], allocate_ahead=True)
        else:
            client = tensord.connect(cfg["socket"])
        n = cfg["size"]

        def handoffs(count, prefix):
            # The queue peer: one bounded queue per consumer, which holds the producer back
            # instead of the semaphore.
            queues = [client.queue(f"{prefix}/c{c}/", depth=cfg["window"]) for c in range(cfg["consumers"])]
            for i in range(count):
                c = consumer_of(index, i, cfg["consumers"])
                if cfg["queue"]:
                    t = queues[c].empty((n,), "uint8")
                else:
                    slots[c].acquire()
                    t = client.empty((n,), "uint8", ns=cfg["ns"])
                a = t.numpy()
                a.fill(i & 0xFF)
                if cfg["queue"]:
                    queues[c].publish(t, wait=cfg["wait"])
                else:
                    client.publish(t, f"{prefix}/c{c}/p{index}/{i}", wait=cfg["wait"])
                del a
                t.release()
            if not cfg["wait"]:
                client.flush()  # raises if any publish failed

        if cfg.get("warm_loop"):
            handoffs(cfg["warm_loop"], f"{cfg['prefix']}/w")
        else:
            tensord_warm_producer(client, cfg, index)

        def timed(start):
            handoffs(cfg["per_producer"], cfg["prefix"])
            return cfg["per_producer"], 0, None
        return timed
    return setup


def tensord_single_consumer(cfg, index, slots):
    import tensord

    def setup():
        client = tensord.connect(cfg["socket"])

        def handoffs(count, prefix):
            checksum = 0
            for _ in range(count):
                t = client.take(prefix, timeout=60.0, readonly=cfg["readonly"])
                a = t.numpy()
                checksum += touch_pages(a)
                del a
                t.release()
                if not cfg["queue"]:
                    slots[index].release()
            return checksum

        if cfg.get("warm_loop"):
            handoffs(len(items_for(index, cfg["producers"], cfg["consumers"], cfg["warm_loop"])),
                     f"{cfg['prefix']}/w/c{index}/")
        else:
            tensord_warm_consumer(client, cfg, index)
        count = len(items_for(index, cfg["producers"], cfg["consumers"], cfg["per_producer"]))

        def timed(start):
            return count, handoffs(count, f"{cfg['prefix']}/c{index}/"), None
        return timed
    return setup


# ---- tensord, batched: the producer put_many's a batch; the consumer take_many's from its
# prefix (cfg["via"] == "take_many") or get_many's the names (cfg["via"] == "get_many") ----
#
# take_many: names are never re-used; a semaphore per consumer counts tensors in flight
# (RING * producers * batch): the producer acquires a batch's worth before put_many, the
# consumer releases one per tensor it took. take_many returns between 1 and max_count
# tensors (what is there), so the consumer asks for what it still expects, up to a batch.
#
# get_many: the names are a ring: producer p's batch j goes to consumer (p + j) % M under
# PREFIX/p<p>/c<c>/s<slot>/<k>, slot = (j // M) % RING; re-publishing a slot retires the
# tensor it held (the consumer's lease keeps it readable). The consumer get_many's a slot's
# names with min_generation one past the newest generation it saw there (generations only
# go up) and checks that every tensor is newer than the last. A semaphore per (producer,
# consumer) with RING permits keeps a slot from being re-used before its consumer has it.

RING = 2


def _batch_routes(producers, consumers, batches):
    """{consumer: [(producer, batch j, use n)]} in the order the consumer reads them."""
    routes = {c: [] for c in range(consumers)}
    uses = {}
    for j in range(batches):
        for p in range(producers):
            c = (p + j) % consumers
            n = uses.get((p, c), 0)
            uses[(p, c)] = n + 1
            routes[c].append((p, j, n))
    return routes


def _ring_names(cfg, p, c, n):
    return [f"{cfg['prefix']}/p{p}/c{c}/s{n % RING}/{k}" for k in range(cfg["batch"])]


def tensord_batched_producer(cfg, index, slots):
    import tensord

    def setup():
        client = tensord.connect(cfg["socket"])
        tensord_warm_producer(client, cfg, index)
        take = cfg["via"] == "take_many"
        n = cfg["size"]
        batch = cfg["batch"]
        batches = cfg["per_producer"] // batch
        mine = {}  # batch j -> (consumer, use n)
        for c, route in _batch_routes(cfg["producers"], cfg["consumers"], batches).items():
            for p, j, use in route:
                if p == index:
                    mine[j] = (c, use)

        def timed(start):
            seq = 0
            for j in range(batches):
                c, use = mine[j]
                if take:
                    for _ in range(batch):
                        slots[("c", c)].acquire()
                    names = [f"{cfg['prefix']}/c{c}/p{index}/{seq + k}" for k in range(batch)]
                else:
                    slots[(index, c)].acquire()
                    names = _ring_names(cfg, index, c, use)
                arrays = [numpy.full(n, (seq + k) & 0xFF, numpy.uint8) for k in range(batch)]
                client.put_many(list(zip(names, arrays)), ns=cfg["ns"])
                seq += batch
            return batches * batch, 0, None
        return timed
    return setup


def _consume(tensors):
    checksum = 0
    for t in tensors:
        a = t.numpy()
        checksum += touch_pages(a)
        del a
        t.release()
    return checksum


def tensord_batched_consumer(cfg, index, slots):
    import tensord

    def setup():
        client = tensord.connect(cfg["socket"])
        tensord_warm_consumer(client, cfg, index)
        batches = cfg["per_producer"] // cfg["batch"]
        route = _batch_routes(cfg["producers"], cfg["consumers"], batches)[index]
        expected = len(route) * cfg["batch"]
        seen = {}  # name -> the generation last read there

        def timed_take(start):
            checksum = 0
            count = 0
            prefix = f"{cfg['prefix']}/c{index}/"
            while count < expected:
                tensors = client.take_many(prefix, min(cfg["batch"], expected - count), timeout=60.0)
                checksum += _consume(tensors)
                count += len(tensors)
                for _ in tensors:
                    slots[("c", index)].release()
            return count, checksum, None

        def timed_get(start):
            checksum = 0
            count = 0
            for p, j, use in route:
                names = _ring_names(cfg, p, index, use)
                newest = max(seen.get(n, 0) for n in names)
                tensors = client.get_many(names, timeout=60.0, min_generation=newest + 1 if newest else None)
                for n, t in zip(names, tensors):
                    if t.generation <= seen.get(n, 0):
                        raise RuntimeError(f"{n}: generation {t.generation} again (flow control broken)")
                    seen[n] = t.generation
                checksum += _consume(tensors)
                count += len(tensors)
                slots[(p, index)].release()
            return count, checksum, None
        return timed_take if cfg["via"] == "take_many" else timed_get
    return setup


# ---- torch.multiprocessing: one Queue(maxsize=window) per consumer ----
# `queues` is (the queues, an Event set once every consumer has all its tensors): with the
# file_descriptor strategy a consumer fetches each fd from the producer's process, so
# producers stay alive until then (torch.mp's own rule).

def torch_producer(cfg, index, shared):
    queues, consumed = shared

    def setup():
        import torch
        import torch.multiprocessing as tmp

        tmp.set_sharing_strategy(cfg["strategy"])
        n = cfg["size"]
        for q in queues:
            for _ in range(cfg["warm"]):
                q.put(torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(cfg["warm_size"])))

        def timed(start):
            for i in range(cfg["per_producer"]):
                # Allocated in shared memory at once (no copy at put), filled in place.
                t = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(n))
                t.fill_(i & 0xFF)
                queues[consumer_of(index, i, cfg["consumers"])].put(t)
                del t
            for q in queues:  # the feeder threads flush before the process may exit
                q.close()
                q.join_thread()
            if not consumed.wait(120):
                raise RuntimeError("the consumers did not get every tensor within 120 s")
            return cfg["per_producer"], 0, None
        return timed
    return setup


def torch_consumer(cfg, index, shared):
    queues, consumed, finished = shared

    def setup():
        import torch.multiprocessing as tmp

        tmp.set_sharing_strategy(cfg["strategy"])
        count = len(items_for(index, cfg["producers"], cfg["consumers"], cfg["per_producer"]))
        for _ in range(cfg["producers"] * cfg["warm"]):
            queues[index].get(timeout=60.0)

        def timed(start):
            checksum = 0
            for _ in range(count):
                t = queues[index].get(timeout=60.0)
                a = t.numpy()
                checksum += touch_pages(a)
                del a, t
            with finished.get_lock():
                finished.value += 1
                if finished.value == cfg["consumers"]:
                    consumed.set()
            return count, checksum, None
        return timed
    return setup


# ---- gRPC bytes copy: each consumer serves a unary Put(bytes) on its own Unix socket ----

GRPC_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def grpc_socket(cfg, consumer):
    return os.path.join(cfg["dir"], f"grpc-{cfg['run']}-{consumer}.sock")


def grpc_producer(cfg, index, ready):
    def setup():
        import grpc

        ready.wait(60)  # every consumer listens
        channels = [grpc.insecure_channel("unix:" + grpc_socket(cfg, c), options=GRPC_OPTIONS)
                    for c in range(cfg["consumers"])]
        puts = [ch.unary_unary("/tensord.bench.Sink/Put") for ch in channels]
        for put in puts:
            put(b"", timeout=60)  # connected before the clock starts
        n = cfg["size"]

        def timed(start):
            for i in range(cfg["per_producer"]):
                payload = bytes((i & 0xFF,)) * n
                puts[consumer_of(index, i, cfg["consumers"])](payload, timeout=60)
            for ch in channels:
                ch.close()
            return cfg["per_producer"], 0, None
        return timed
    return setup


def grpc_consumer(cfg, index, ready, listening):
    def setup():
        from concurrent import futures

        import grpc

        count = len(items_for(index, cfg["producers"], cfg["consumers"], cfg["per_producer"]))
        lock = threading.Lock()
        state = {"count": 0, "checksum": 0}
        done = threading.Event()

        def put(request, context):
            if not request:  # the producers' warm-up call
                return b""
            value = touch_pages(numpy.frombuffer(request, numpy.uint8))
            with lock:
                state["count"] += 1
                state["checksum"] += value
                if state["count"] == count:
                    done.set()
            return b""

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=GRPC_OPTIONS)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "tensord.bench.Sink", {"Put": grpc.unary_unary_rpc_method_handler(put)}),))
        server.add_insecure_port("unix:" + grpc_socket(cfg, index))
        server.start()
        with listening.get_lock():
            listening.value += 1
            if listening.value == cfg["consumers"]:
                ready.set()

        def timed(start):
            # Generous: 64 MiB copies through Python's gRPC run at a few per second on a small
            # machine, and a stalled run still ends with the count that arrived.
            if count and not done.wait(600):
                raise RuntimeError(f"gRPC consumer {index}: {state['count']} of {count} arrived")
            end = time.monotonic()
            server.stop(5).wait()  # lets the last responses go out
            return count, state["checksum"], [int((end - start) * 1e9)]
        return timed
    return setup


# ---- the floor: what is left of a handoff when nothing is allocated, mapped or faulted in
# while the clock runs. `shared` is (one shared anonymous mmap made before the fork, window,
# each consumer's queue of free slots, each consumer's queue of filled ones); consumer c's
# slots are `window` consecutive blocks of the size. The producer fills a slot as the
# tensord single producer fills its tensor, the consumer reads it with the same touch ----

def _slot_views(memory, consumer, window, size):
    return [numpy.frombuffer(memory, numpy.uint8, count=size, offset=(consumer * window + slot) * size)
            for slot in range(window)]


def floor_producer(cfg, index, shared):
    memory, window, free, ready = shared

    def setup():
        slots = [_slot_views(memory, c, window, cfg["size"]) for c in range(cfg["consumers"])]
        for views in slots:
            for a in views:
                a[::PAGE] = 0  # every page mapped writable in this process before the clock

        def timed(start):
            for i in range(cfg["per_producer"]):
                c = consumer_of(index, i, cfg["consumers"])
                slot = free[c].get()
                slots[c][slot].fill(i & 0xFF)
                ready[c].put(slot)
            return cfg["per_producer"], 0, None
        return timed
    return setup


def floor_consumer(cfg, index, shared):
    memory, window, free, ready = shared

    def setup():
        views = _slot_views(memory, index, window, cfg["size"])
        for a in views:
            touch_pages(a)  # every page mapped in this process before the clock
        count = len(items_for(index, cfg["producers"], cfg["consumers"], cfg["per_producer"]))

        def timed(start):
            checksum = 0
            for _ in range(count):
                slot = ready[index].get()
                checksum += touch_pages(views[slot])
                free[index].put(slot)
            return count, checksum, None
        return timed
    return setup


# ---- the same tensor again and again: tensord get vs torch.mp file_system ----

def tensord_repeat_consumer(cfg, index, _):
    import tensord

    def setup():
        client = tensord.connect(cfg["socket"], lease_cache=cfg["cache"])
        name = cfg["name"]
        for _ in range(cfg["warmup"]):
            t = client.get(name)
            touch_head(t.numpy())
            t.release()

        def timed(start):
            checksum = 0
            samples = []
            clock = time.perf_counter_ns
            for _ in range(cfg["count"]):
                t0 = clock()
                t = client.get(name)
                a = t.numpy()
                checksum += touch_head(a)
                del a
                t.release()
                samples.append(clock() - t0)
            return cfg["count"], checksum, samples
        return timed
    return setup


def torch_repeat_producer(cfg, index, queues):
    def setup():
        import torch
        import torch.multiprocessing as tmp

        tmp.set_sharing_strategy(cfg["strategy"])
        t = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(cfg["size"]))
        t.fill_(1)

        def timed(start):
            for _ in range(cfg["warmup"] + cfg["count"]):
                queues[0].put(t)
            queues[0].close()
            queues[0].join_thread()
            return cfg["count"], 0, None
        return timed
    return setup


def torch_repeat_consumer(cfg, index, queues):
    def setup():
        import torch.multiprocessing as tmp

        tmp.set_sharing_strategy(cfg["strategy"])

        def timed(start):
            checksum = 0
            samples = []
            clock = time.perf_counter_ns
            for _ in range(cfg["warmup"]):
                t = queues[0].get(timeout=60.0)
                touch_head(t.numpy())
                del t
            for _ in range(cfg["count"]):
                t0 = clock()
                t = queues[0].get(timeout=60.0)
                a = t.numpy()
                checksum += touch_head(a)
                del a, t
                samples.append(clock() - t0)
            return cfg["count"], checksum, samples
        return timed
    return setup
