"""compare.py's Python experiments: fresh-tensor handoffs from N producer processes to M
consumer processes through every peer (tensord single and batched, torch.multiprocessing
queues, a gRPC bytes copy, the floor), and a repeated get of one unchanged tensor.
"""

import inspect
import mmap
import statistics

import peers

KIB = 1024
MIB = 1024 * KIB


def size_label(n):
    if n >= 1024 * MIB:
        return f"{n // (1024 * MIB)} GiB"
    if n >= MIB:
        return f"{n // MIB} MiB"
    return f"{n // KIB} KiB"


# ---- the Python experiments ----

def expected_checksum(producers, per_producer, size):
    pages = (size + peers.PAGE - 1) // peers.PAGE
    return pages * producers * sum(i & 0xFF for i in range(per_producer))


def handoff(runner, peer, producers, consumers, size, per_producer, batch, window):
    runner.run_id += 1
    # Names start with their namespace: an arena tensor can be published only into the
    # namespace it was allocated in.
    prefix = f"{peer.get('ns') or 'x'}{runner.run_id}"
    cfg = {"socket": runner.socket, "run": runner.run_id, "dir": runner.dir, "size": size,
           "producers": producers, "consumers": consumers, "per_producer": per_producer,
           "batch": batch, "prefix": prefix, "ns": prefix if peer.get("ns") else None,
           "strategy": peer.get("strategy"), "via": peer.get("via"), "wait": peer.get("wait", True),
           "readonly": peer.get("readonly", False), "ahead": peer.get("ahead", False),
           "queue": peer.get("queue", False), "window": window,
           # Large tensors: a window of them before the clock, as a producer that has been
           # running has handed over (peers.py, warm-up); tensord's single handoffs run their
           # own loop for four windows per consumer first (peers.py, "warm_loop").
           "warm": window if size > 64 * KIB else 1, "warm_size": size if size > 64 * KIB else peers.WARM_SIZE,
           "warm_loop": 4 * window * consumers if size > 64 * KIB else 0}
    if per_producer % batch:
        raise ValueError(f"{per_producer} tensors per producer is not a whole number of batches of {batch}")
    kind = peer["kind"]
    ctx = runner.ctx
    workers = []
    memory = None
    if kind == "tensord-single":
        slots = [ctx.Semaphore(window) for _ in range(consumers)]
        make_p, make_c, shared = peers.tensord_single_producer, peers.tensord_single_consumer, slots
    elif kind == "tensord-batched":
        ring = peers.RING
        slots = {(p, c): ctx.Semaphore(ring) for p in range(producers) for c in range(consumers)}
        slots.update({("c", c): ctx.Semaphore(ring * producers * batch) for c in range(consumers)})
        make_p, make_c, shared = peers.tensord_batched_producer, peers.tensord_batched_consumer, slots
    elif kind == "torch":
        queues = [ctx.Queue(maxsize=window) for _ in range(consumers)]
        consumed, finished = ctx.Event(), ctx.Value("i", 0)
        workers += [("consumer", c, peers.torch_consumer(cfg, c, (queues, consumed, finished)))
                    for c in range(consumers)]
        workers += [("producer", p, peers.torch_producer(cfg, p, (queues, consumed)))
                    for p in range(producers)]
    elif kind == "grpc":
        ready = ctx.Event()
        listening = ctx.Value("i", 0)
        for c in range(consumers):
            workers.append(("consumer", c, peers.grpc_consumer(cfg, c, ready, listening)))
        for p in range(producers):
            workers.append(("producer", p, peers.grpc_producer(cfg, p, ready)))
    elif kind == "floor":
        # `window` slots per consumer in one shared anonymous mapping, made before the fork;
        # each consumer's free slots wait in a queue, which is its window.
        memory = mmap.mmap(-1, consumers * window * size)
        free = [ctx.SimpleQueue() for _ in range(consumers)]
        for queue in free:
            for slot in range(window):
                queue.put(slot)
        ready = [ctx.SimpleQueue() for _ in range(consumers)]
        make_p, make_c, shared = peers.floor_producer, peers.floor_consumer, (memory, window, free, ready)
    if kind.startswith("tensord") or kind == "floor":
        workers += [("consumer", c, make_c(cfg, c, shared)) for c in range(consumers)]
        workers += [("producer", p, make_p(cfg, p, shared)) for p in range(producers)]
    try:
        results = runner.run(workers)
    finally:
        if memory is not None:
            memory.close()
    start = min(r[3] for r in results)
    end = max(r[4] for r in results if r[1] == "consumer")
    count = sum(r[5] for r in results if r[1] == "consumer")
    checksum = sum(r[6] for r in results if r[1] == "consumer")
    if count != producers * per_producer:
        raise RuntimeError(f"{peer['label']}: {count} tensors arrived of {producers * per_producer}")
    if checksum != expected_checksum(producers, per_producer, size):
        raise RuntimeError(f"{peer['label']}: the consumers read the wrong data")
    seconds = end - start
    return {"rate": count / seconds, "gbps": count * size / seconds / 1e9, "seconds": seconds, "count": count}


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * (len(values) - 1) + 0.5))]


def repeat_stats(samples_ns):
    us = [s / 1000.0 for s in samples_ns]
    return {"mean_us": sum(us) / len(us), "p50_us": percentile(us, 0.5), "p99_us": percentile(us, 0.99)}


def repeated(runner, size, count, warmup):
    """tensord get+read+release (lease cache on and off) and torch.mp file_system handoffs
    of one unchanged tensor."""
    out = {}
    runner.run_id += 1
    name = f"r{runner.run_id}/t"

    def publisher():
        import numpy
        import tensord

        client = tensord.connect(runner.socket)
        client.put(name, numpy.ones(size, numpy.uint8), ns=f"r{runner.run_id}")
        client.close()
        return lambda start: (0, 0, None)

    runner.run([("publisher", 0, publisher)])
    for cache in (True, False):
        cfg = {"socket": runner.socket, "name": name, "count": count, "warmup": warmup, "cache": cache}
        result = runner.run([("consumer", 0, peers.tensord_repeat_consumer(cfg, 0, None))])[0]
        if result[6] != 64 * count:
            raise RuntimeError("tensord repeated get read the wrong data")
        out["tensord-cache" if cache else "tensord-nocache"] = repeat_stats(result[7])
    cfg = {"size": size, "count": count, "warmup": warmup, "strategy": "file_system"}
    queues = [runner.ctx.Queue(maxsize=16)]
    results = runner.run([("consumer", 0, peers.torch_repeat_consumer(cfg, 0, queues)),
                          ("producer", 0, peers.torch_repeat_producer(cfg, 0, queues))])
    consumer = [r for r in results if r[1] == "consumer"][0]
    if consumer[6] != 64 * count:
        raise RuntimeError("torch repeated handoff read the wrong data")
    out["torch-file_system"] = repeat_stats(consumer[7])
    return out


FLOOR = "floor: fill + read of mapped memory"
STEADY = "tensord steady producer (ns)"

# "(ns)": allocated in a namespace. Up to the daemon's arena limit (--arena-max-tensor, 1 MiB)
# a tensor is carved from the namespace's arena; a larger one gets a dedicated buffer, which
# goes back to its producer's pool when released and carries that producer's next tensor of
# the size.
HANDOFF_PEERS = [
    {"label": "tensord single (ns)", "kind": "tensord-single", "ns": "h"},
    {"label": "tensord single nowait (ns)", "kind": "tensord-single", "ns": "n", "wait": False},
    {"label": "tensord single, readonly take (ns)", "kind": "tensord-single", "ns": "r", "readonly": True,
     "large_only": True},
    # What docs/performance.md advises a steady producer of big tensors to use.
    {"label": STEADY, "kind": "tensord-single", "ns": "s", "readonly": True, "wait": False, "ahead": True,
     "large_only": True},
    # What the README shows first: client.queue(prefix, depth=window), put-less empty + fill
    # + q.publish, q.get; the queue bounds the producer (no semaphore) and knows its namespace.
    {"label": "tensord queue (depth = window)", "kind": "tensord-single", "queue": True},
    {"label": "tensord single (own memfd)", "kind": "tensord-single", "ns": None, "small_only": True},
    {"label": "tensord batched take (ns)", "kind": "tensord-batched", "ns": "b", "via": "take_many"},
    {"label": "tensord batched take (own memfd)", "kind": "tensord-batched", "ns": None, "via": "take_many",
     "small_only": True},
    {"label": "tensord batched get (ns)", "kind": "tensord-batched", "ns": "g", "via": "get_many",
     "small_only": True},
    {"label": "torch.mp file_system", "kind": "torch", "strategy": "file_system"},
    {"label": "torch.mp file_descriptor", "kind": "torch", "strategy": "file_descriptor"},
    {"label": "gRPC bytes copy", "kind": "grpc"},
    {"label": FLOOR, "kind": "floor", "large_only": True},
]


def via(peer):
    """How a peer's producer makes and hands over a fresh tensor, and how its consumer gets it."""
    kind = peer["kind"]
    if kind == "tensord-single":
        if peer.get("queue"):
            return "q = queue(prefix, depth=window); q.empty + fill in place + q.publish -> q.get()"
        if peer.get("ahead"):
            return ("connect(allocate_ahead=True), empty(ns) + fill in place + publish(wait=False), "
                    "flush() at the end -> take(prefix, readonly=True)")
        if not peer.get("wait", True):
            return "empty(ns) + fill in place + publish(wait=False), flush() at the end -> take(prefix)"
        if peer.get("readonly"):
            return "empty(ns) + fill in place + publish -> take(prefix, readonly=True)"
        return "empty(ns) + fill in place + publish -> take(prefix)"
    if kind == "tensord-batched":
        consumer = ("take_many(prefix, batch)" if peer["via"] == "take_many"
                    else "get_many(names of a ring, min_generation)")
        return f"fill numpy arrays + put_many (copies them) -> {consumer}"
    if kind == "torch":
        return "tensor allocated in shared memory + fill + Queue.put -> Queue.get"
    if kind == "floor":
        return "fill a slot of memory mapped before the clock + its index on a pipe -> read, index back"
    return "bytes filled + unary call (copied over the socket) -> handler"


def handoff_sizes(args):
    """The small and the large size of the fresh-tensor handoffs."""
    return (4 * KIB, 1 * MIB) if args.smoke else (4 * KIB, 64 * MIB)


def run_python(runner, log):
    args = runner.args
    small, large = handoff_sizes(args)
    plans = {small: {"per_producer": 8 if args.smoke else 4096, "batch": 4 if args.smoke else 64,
                     "window": 8 if args.smoke else 128},
             large: {"per_producer": 4 if args.smoke else 96, "batch": 2 if args.smoke else 4,
                     "window": 4 if args.smoke else 8}}
    import tensord

    has_take_many = hasattr(tensord.Client, "take_many")
    has_readonly_take = "readonly" in inspect.signature(tensord.Client.take).parameters
    has_allocate_ahead = "allocate_ahead" in inspect.signature(tensord.connect).parameters
    handoffs = []
    for producers, consumers in args.pairs:
        for size in (small, large):
            plan = plans[size]
            group = []
            for peer in HANDOFF_PEERS:
                if peer.get("small_only") and size != small or peer.get("large_only") and size != large:
                    continue
                if peer.get("via") == "take_many" and not has_take_many:
                    log(f"skipped {peer['label']}: this build's client has no take_many")
                    continue
                if peer.get("readonly") and not has_readonly_take:
                    log(f"skipped {peer['label']}: this build's take() has no readonly")
                    continue
                if peer.get("ahead") and not has_allocate_ahead:
                    log(f"skipped {peer['label']}: this build's connect() has no allocate_ahead")
                    continue
                group.append(peer)
            runs = {peer["label"]: [] for peer in group}
            for r in range(args.rounds):
                # Rounds interleave the peers, each in a different place every round, so a
                # slow spell of the machine lands on several peers, not on one peer's only run.
                for peer in group[r % len(group):] + group[:r % len(group)]:
                    log(f"handoff {peer['label']} {producers}->{consumers} {size_label(size)}"
                        f" (round {r + 1} of {args.rounds})")
                    runs[peer["label"]].append(handoff(runner, peer, producers, consumers, size,
                                                       plan["per_producer"], plan["batch"], plan["window"]))
            for peer in group:
                rates = [f["rate"] for f in runs[peer["label"]]]
                median = runs[peer["label"]][rates.index(statistics.median_low(rates))]
                batch = plan["batch"] if peer["kind"] == "tensord-batched" else 1
                handoffs.append({"peer": peer["label"], "producers": producers, "consumers": consumers,
                                 "size": size, "batch": batch, "window": plan["window"], "via": via(peer),
                                 **median, "rate_min": min(rates), "rate_max": max(rates),
                                 "round_rates": rates})
    repeats = {}
    for size in ((4 * KIB, 1 * MIB) if args.smoke else (4 * KIB, 256 * MIB)):
        log(f"repeated get vs torch.mp file_system {size_label(size)}")
        repeats[size] = repeated(runner, size, 50 if args.smoke else 5000, 5 if args.smoke else 500)
    return handoffs, repeats
