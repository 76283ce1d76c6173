#!/usr/bin/python3
"""The comparative benchmark of tensord (issue 5), in one run on one machine.

Runs, against daemons it starts on private sockets:
  - tensord_bench (C++, Google Benchmark): the floors (Unix-socket round trip, gRPC
    bidi-stream round trip, memfd fd-passing handoff), tensord acquire/publish/release
    latencies by size, kill -9 -> leases released, daemon memory per live lease;
  - in Python processes: fresh-tensor handoffs N producers -> M consumers through tensord
    (single and batched, with and without a namespace), torch.multiprocessing queues
    (file_system and file_descriptor sharing), a gRPC bytes copy and, at the large size,
    the floor (the same fill and read of memory mapped before the clock); and a repeated
    get of an unchanged tensor against a torch.mp file_system handoff of the same tensor.
    Every handoff peer runs --rounds times (default 3), the peers interleaved; a row shows
    the median round and the range, and the targets compare medians. The three p50s of the
    first-acquire target are measured again in as many repetitions, interleaved;
and prints one table with every figure and a "targets" section (--json: all of it as JSON).

Run with Debian's /usr/bin/python3 (torch, numpy, grpcio), from the repository root:
    /usr/bin/python3 tests/bench/compare.py --build-dir build-rel
docs/performance.md says what each row measures and how to read the targets.
"""

import argparse
import inspect
import json
import mmap
import multiprocessing
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import peers  # noqa: E402

KIB = 1024
MIB = 1024 * KIB


def size_label(n):
    if n >= 1024 * MIB:
        return f"{n // (1024 * MIB)} GiB"
    if n >= MIB:
        return f"{n // MIB} MiB"
    return f"{n // KIB} KiB"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(REPO, "build-rel"),
                   help="the CMake build directory (default: build-rel)")
    p.add_argument("--tensord", help="the daemon binary (default: BUILD/server/tensord)")
    p.add_argument("--bench", help="tensord_bench (default: BUILD/tests/bench/tensord_bench)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--json-out", help="also write the JSON to this file")
    p.add_argument("--smoke", action="store_true",
                   help="tiny counts and sizes: checks that everything runs (figures mean nothing)")
    p.add_argument("--pairs", default="1x1,2x2", help="producers x consumers (default 1x1,2x2)")
    p.add_argument("--skip-cpp", action="store_true", help="do not run tensord_bench")
    p.add_argument("--cpp-filter", default="", help="--benchmark_filter for tensord_bench")
    p.add_argument("--leases", type=int, default=1000000, help="live leases for the memory figure")
    p.add_argument("--rounds", type=int, default=None,
                   help="runs of every handoff peer, interleaved; each row shows the median round "
                        "and the range (default 3, 1 with --smoke)")
    args = p.parse_args()
    if args.rounds is None:
        args.rounds = 1 if args.smoke else 3
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    args.tensord = args.tensord or os.path.join(args.build_dir, "server", "tensord")
    args.bench = args.bench or os.path.join(args.build_dir, "tests", "bench", "tensord_bench")
    args.pairs = [tuple(int(x) for x in pair.split("x")) for pair in args.pairs.split(",")]
    return args


# ---- processes: everything started here is stopped in Runner.close() ----

def process_cpu(pid):
    """utime + stime of a live process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Runner:
    def __init__(self, args):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="tensord-compare-")
        self.popens = []
        self.workers = []
        self.ctx = multiprocessing.get_context("fork")
        self.socket = None
        self.run_id = 0

    def start_daemon(self):
        self.socket = os.path.join(self.dir, "tensord.sock")
        daemon = subprocess.Popen([self.args.tensord, "--socket", self.socket, "--log-level", "warn"],
                                  stdin=subprocess.DEVNULL)
        self.popens.append(daemon)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if daemon.poll() is not None:
                raise RuntimeError(f"tensord exited at start with status {daemon.returncode}")
            if os.path.exists(self.socket) and os.path.exists(self.socket + ".fd"):
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                try:
                    probe.connect(self.socket + ".fd")
                    return
                except OSError:
                    pass
                finally:
                    probe.close()
            time.sleep(0.01)
        raise RuntimeError(f"tensord did not start serving on {self.socket}")

    def run(self, workers, timeout=300):
        """workers: [(role, index, setup)]; returns the 'ok' result tuples."""
        barrier = self.ctx.Barrier(len(workers), timeout=120)
        results = self.ctx.Queue()
        procs = []
        for role, index, setup in workers:
            proc = self.ctx.Process(target=peers.run_worker, args=(results, barrier, role, index, setup),
                                    daemon=True)
            proc.start()
            procs.append(proc)
            self.workers.append(proc)
        got = []
        errors = []
        deadline = time.monotonic() + timeout
        try:
            while len(got) + len(errors) < len(workers):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"workers did not finish in {timeout} s")
                try:
                    result = results.get(timeout=min(left, 1.0))
                except Exception:  # queue.Empty; a worker that died without reporting
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead and not errors:
                        raise RuntimeError(f"a worker died with exit code {dead[0].exitcode}")
                    continue
                (errors if result[0] == "error" else got).append(result)
                if errors:
                    break
            if errors:
                raise RuntimeError("worker failed:\n" + "\n".join(f"{e[1]} {e[2]}:\n{e[3]}" for e in errors))
        finally:
            for proc in procs:
                proc.join(timeout=0 if errors else 10)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        return got

    def close(self):
        for proc in self.workers:
            if proc.is_alive():
                proc.kill()
                proc.join()
        for popen in reversed(self.popens):
            if popen.poll() is None:
                try:
                    os.killpg(popen.pid, signal.SIGTERM) if getattr(popen, "own_group", False) \
                        else popen.terminate()
                    popen.wait(timeout=10)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    pass
            if popen.poll() is None:
                if getattr(popen, "own_group", False):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.kill()
                popen.wait()
        subprocess.run(["rm", "-rf", self.dir], check=False)


# ---- the C++ benchmark ----

# The first-acquire target is a ratio of three p50s; measured once each they are taken
# seconds apart, and a slow spell of the machine under one of them moves the ratio. They
# are measured again in repetitions that Google Benchmark interleaves at random, and the
# target takes the median of each.
FIRST_ACQUIRE_PARTS = ("floor/grpc_bidi_rtt", "floor/memfd_handoff", "tensord/acquire_unmapped/4KiB")


def run_cpp(runner, extra=()):
    args = runner.args
    cmd = [args.bench, "--benchmark_format=json", "--tensord", args.tensord, "--leases", str(args.leases),
           *extra]
    if args.smoke:
        cmd.append("--quick")
    if args.cpp_filter and not extra:
        cmd.append("--benchmark_filter=" + args.cpp_filter)
    # Its own process group: its daemon and helpers go with it in close().
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    popen.own_group = True
    runner.popens.append(popen)
    out, err = popen.communicate(timeout=900)
    if popen.returncode != 0:
        raise RuntimeError(f"tensord_bench failed ({popen.returncode}):\n{err[-4000:]}")
    # Google Benchmark appends "/iterations:N/manual_time" to the registered names.
    benchmarks = json.loads(out)["benchmarks"]
    for b in benchmarks:
        b["name"] = re.sub(r"/(iterations:\d+|manual_time)", "", b["name"])
    return benchmarks


def run_cpp_first_acquire(runner, repetitions):
    """{part: [p50 of each repetition]} for FIRST_ACQUIRE_PARTS."""
    pattern = "^(" + "|".join(FIRST_ACQUIRE_PARTS) + ")/"
    runs = run_cpp(runner, ("--benchmark_filter=" + pattern, f"--benchmark_repetitions={repetitions}",
                            "--benchmark_enable_random_interleaving=true"))
    p50s = {part: [] for part in FIRST_ACQUIRE_PARTS}
    for b in runs:
        if b.get("run_type") == "iteration" and b["name"] in p50s:
            p50s[b["name"]].append(b["p50_us"])
    return p50s


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


# ---- the table ----

def machine_info(args):
    def read(path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""
    model = next((line.split(":", 1)[1].strip() for line in read("/proc/cpuinfo").splitlines()
                  if line.startswith("model name")), "unknown")
    mem = next((line.split()[1] for line in read("/proc/meminfo").splitlines() if line.startswith("MemTotal")), "0")
    def git(*argv):  # a copy of the tree without git (a GPU machine) says TENSORD_COMMIT
        try:
            return subprocess.run(["git", "-C", REPO, *argv], capture_output=True, text=True).stdout
        except OSError:
            return ""
    commit = git("rev-parse", "--short", "HEAD").strip() or os.environ.get("TENSORD_COMMIT", "unknown")
    dirty = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
    versions = {}
    for module in ("torch", "numpy", "grpc"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = "missing"
    return {"cpu": model, "cores": os.cpu_count(), "mem_gib": round(int(mem) / 1048576, 1),
            "kernel": platform.release(), "python": platform.python_version(), **versions,
            "commit": commit, "uncommitted": dirty, "load_before": os.getloadavg(),
            "smoke": args.smoke}


def fmt(value, digits=1):
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def build_targets(cpp, first_acquire, handoffs, repeats, args):
    targets = []

    def add(what, measured, required, met, detail):
        targets.append({"target": what, "measured": measured, "required": required,
                        "met": bool(met) if met is not None else None, "detail": detail})

    small = 4 * KIB
    large = 1 * MIB if args.smoke else 256 * MIB
    for size in (small, large):
        r = repeats.get(size)
        if r:
            ratio = r["tensord-cache"]["mean_us"] / r["torch-file_system"]["mean_us"]
            add(f"repeated get+read+release vs torch.mp file_system handoff, {size_label(size)}",
                f"{ratio:.3f}x", "<= 0.5x", ratio <= 0.5,
                f"tensord {r['tensord-cache']['mean_us']:.1f} us, torch {r['torch-file_system']['mean_us']:.1f} us (means)")

    def p50(name):
        b = cpp.get(name)
        return None if b is None else b["p50_us"]
    first, rtt, handoff_floor = p50("tensord/acquire_unmapped/4KiB"), p50("floor/grpc_bidi_rtt"), \
        p50("floor/memfd_handoff")
    how = "(p50s)"
    if first_acquire and all(first_acquire.values()):
        # The interleaved repetitions: the median of each part's p50s.
        def listed(values):
            return "/".join(f"{v:.1f}" for v in values)
        rtt_runs, handoff_runs, first_runs = (first_acquire[part] for part in FIRST_ACQUIRE_PARTS)
        rtt, handoff_floor, first = (statistics.median_low(runs) for runs in (rtt_runs, handoff_runs, first_runs))
        how = (f"(medians of the p50s of {len(first_runs)} interleaved repetitions: {listed(first_runs)}; "
               f"{listed(rtt_runs)}; {listed(handoff_runs)})")
    if None not in (first, rtt, handoff_floor):
        ratio = first / (rtt + handoff_floor)
        add("first acquire (lease, desc, fd, mmap) vs gRPC stream RTT + memfd handoff, 4 KiB",
            f"{ratio:.2f}x", "<= 1.5x", ratio <= 1.5,
            f"acquire_unmapped p50 {first:.1f} us; {rtt:.1f} + {handoff_floor:.1f} us {how}")
        new_client = p50("tensord/acquire_first/4KiB")
        if new_client is not None:
            add("(info) first acquire in a new client, same floors", f"{new_client / (rtt + handoff_floor):.2f}x",
                "-", None, f"acquire_first p50 {new_client:.1f} us: includes opening the session stream")

    def row(peer, producers, consumers, size):
        for h in handoffs:
            if (h["peer"], h["producers"], h["consumers"], h["size"]) == (peer, producers, consumers, size):
                return h
        return None

    def rate_text(h):
        spread = f" [{h['rate_min']:,.0f}-{h['rate_max']:,.0f}]" if len(h["round_rates"]) > 1 else ""
        return f"{h['rate']:,.0f}/s{spread}"

    def versus(what, peer, base, required, required_text=None):
        h = row(peer, producers, consumers, base["size"]) if base else None
        if h:
            ratio = h["rate"] / base["rate"]
            add(what, f"{ratio:.2f}x", "-" if required is None else f">= {required_text or f'{required:g}x'}",
                None if required is None else ratio >= required,
                f"{rate_text(h)} vs {rate_text(base)}")

    handoff_large = handoff_sizes(args)[1]
    for producers, consumers in args.pairs:
        torch_row = row("torch.mp file_system", producers, consumers, small)
        n_m = f"{producers}->{consumers}"
        # torch.mp's Queue.put returns before the consumer has anything (a feeder thread
        # writes it), as publish(wait=False) does; the waited publish is shown as info.
        versus(f"fresh 4 KiB handoffs/s {n_m}: single, publish(wait=False) vs torch.mp file_system",
               "tensord single nowait (ns)", torch_row, 1)
        versus(f"(info) fresh 4 KiB handoffs/s {n_m}: single, publish waits for its reply",
               "tensord single (ns)", torch_row, None)
        for how in ("take", "get"):
            versus(f"fresh 4 KiB handoffs/s {n_m}: batched ({how}_many) vs torch.mp file_system",
                   f"tensord batched {how} (ns)", torch_row, 3)
        # Large tensors: the fill and the read are most of a handoff, so tensord is held to
        # the floor (the same fill and read of memory mapped before the clock).
        versus(f"fresh {size_label(handoff_large)} handoffs/s {n_m}: tensord single vs torch.mp file_system",
               "tensord single (ns)", row("torch.mp file_system", producers, consumers, handoff_large), 2)
        versus(f"fresh {size_label(handoff_large)} handoffs/s {n_m}: tensord single vs the floor",
               "tensord single (ns)", row(FLOOR, producers, consumers, handoff_large),
               1 / 1.5, f"{1 / 1.5:.2f}x (within 1.5x of the floor)")
        versus(f"(info) fresh {size_label(handoff_large)} handoffs/s {n_m}: read-only takes vs the floor",
               "tensord single, readonly take (ns)", row(FLOOR, producers, consumers, handoff_large), None)
        # The same targets for the settings a steady producer of big tensors is advised to use.
        versus(f"fresh {size_label(handoff_large)} handoffs/s {n_m}: steady producer vs torch.mp file_system",
               STEADY, row("torch.mp file_system", producers, consumers, handoff_large), 2)
        versus(f"fresh {size_label(handoff_large)} handoffs/s {n_m}: steady producer vs the floor",
               STEADY, row(FLOOR, producers, consumers, handoff_large),
               1 / 1.5, f"{1 / 1.5:.2f}x (within 1.5x of the floor)")

    for kind in ("acquire_unmapped", "acquire_first", "acquire_repeated"):
        suffix = "/cache:0" if kind == "acquire_repeated" else ""
        a, b = p50(f"tensord/{kind}/4KiB{suffix}"), p50(f"tensord/{kind}/1GiB{suffix}")
        if None not in (a, b):
            add(f"acquire latency independent of size: {kind}{suffix} 1 GiB vs 4 KiB", f"{b / a:.2f}x",
                "<= 1.5x", b <= 1.5 * a, f"{b:.1f} us vs {a:.1f} us (p50s)")

    mem = cpp.get("tensord/memory_per_lease")
    if mem:
        add("daemon memory per live lease", f"{mem['bytes_per_lease']:.0f} B", "<= 512 B",
            mem["bytes_per_lease"] <= 512, f"{mem['leases']:.0f} leases, RSS {mem['rss_before_MiB']:.1f} -> "
            f"{mem['rss_held_MiB']:.1f} MiB")
    for leases in (1, 10000):
        k = cpp.get(f"tensord/kill9_release/{leases}")
        if k:
            add(f"kill -9 of a holder of {leases} lease(s) -> released (p99)", f"{k['p99_us'] / 1000:.2f} ms",
                "<= 10 ms", k["p99_us"] <= 10000,
                f"p50 {k['p50_us'] / 1000:.2f} ms; the kernel reaped it after {k['reaped_p50_us'] / 1000:.2f} ms (p50)")
    return targets


def print_table(data):
    m = data["machine"]
    out = [f"tensord comparative benchmark: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, Linux "
           f"{m['kernel']}, python {m['python']}, torch {m['torch']}, numpy {m['numpy']}, grpcio {m['grpc']}; "
           f"commit {m['commit']}" + (f" with uncommitted changes to {', '.join(m['uncommitted'][:8])}"
                                      if m["uncommitted"] else "") +
           f"; load average before {m['load_before'][0]:.2f}" + ("  [SMOKE: figures mean nothing]"
                                                                 if m["smoke"] else "")]
    cpp = data["cpp"]
    if cpp:
        out.append("\nFloors (C++, two processes over a Unix socket)          p50 us    p99 us   mean us")
        for name, what in (("floor/unix_stream_rtt", "Unix stream socket round trip, 64 B"),
                           ("floor/grpc_bidi_rtt", "gRPC bidi-stream round trip, 64 B"),
                           ("floor/memfd_handoff", "memfd: create, write 4 KiB, pass, map, read, ack"),
                           ("floor/fd_pass_existing", "existing memfd: pass, map, read, ack")):
            b = cpp.get(name)
            if b:
                out.append(f"  {what:<53}{fmt(b['p50_us']):>8}{fmt(b['p99_us']):>10}{fmt(b['real_time']):>10}")
        out.append("\ntensord latency (C++ client; read = first byte)    size     p50 us    p99 us   mean us  buffer")
        for name, b in cpp.items():
            if not name.startswith("tensord/") or name.startswith(("tensord/kill9", "tensord/memory")):
                continue
            parts = name.split("/")
            what = parts[1] + ("" if len(parts) < 4 else " " + parts[3])
            size = parts[2] if len(parts) > 2 else ""
            buffer = ""
            if "buffer_bytes" in b:
                nbytes = {"4KiB": 4 * KIB, "1MiB": MIB}.get(size.split("-")[0])
                buffer = "arena" if nbytes and b["buffer_bytes"] > nbytes else "own memfd"
            extra = ""
            if "publish_p50_us" in b:
                extra = f"  allocate p50 {fmt(b['allocate_p50_us'])}, publish p50 {fmt(b['publish_p50_us'])}"
            out.append(f"  {what:<48}{size:<10}{fmt(b['p50_us']):>8}{fmt(b['p99_us']):>10}{fmt(b['real_time']):>10}"
                       f"  {buffer}{extra}")
        out.append("\nDaemon")
        mem = cpp.get("tensord/memory_per_lease")
        if mem:
            out.append(f"  memory per live lease: {mem['bytes_per_lease']:.0f} B ({mem['leases']:.0f} leases; RSS "
                       f"{mem['rss_before_MiB']:.1f} -> {mem['rss_held_MiB']:.1f} MiB; all released "
                       f"{mem['release_all_ms']:.0f} ms after kill -9)")
        for leases in (1, 10000):
            k = cpp.get(f"tensord/kill9_release/{leases}")
            if k:
                out.append(f"  kill -9 of a holder of {leases:>5} lease(s) -> released: p50 {k['p50_us'] / 1000:.2f} ms, "
                           f"p99 {k['p99_us'] / 1000:.2f} ms (kernel reaped it: p50 {k['reaped_p50_us'] / 1000:.2f} ms)")
    if data["repeated"]:
        out.append("\nThe same unchanged tensor again and again (Python; read = sum of the first 64 bytes)"
                   "\n                                                     size   mean us    p50 us    p99 us")
        for size, r in data["repeated"].items():
            for key, what in (("tensord-cache", "tensord get+read+release, lease cache on"),
                              ("tensord-nocache", "tensord get+read+release, lease cache off"),
                              ("torch-file_system", "torch.mp file_system Queue handoff, pipelined")):
                s = r[key]
                out.append(f"  {what:<45}{size_label(int(size)):>11}{fmt(s['mean_us']):>10}{fmt(s['p50_us']):>10}"
                           f"{fmt(s['p99_us']):>10}")
    if data["handoffs"]:
        width = max(len(h["peer"]) for h in data["handoffs"]) + 2
        out.append("\nHandoffs of fresh tensors, producer processes -> consumer processes (Python; the consumer reads"
                   "\none byte per 4 KiB page of each tensor; at most `window` tensors in flight"
                   "\nper consumer; the median of the rounds, and the range)"
                   f"\n  {'peer':<{width}}N->M      size   batch  window    tensors/s      GB/s   range (tensors/s)")
        for h in data["handoffs"]:
            out.append(f"  {h['peer']:<{width}}{h['producers']}->{h['consumers']:<5}{size_label(h['size']):>8}"
                       f"{h['batch']:>8}{h['window']:>8}{h['rate']:>13,.0f}{h['gbps']:>10.2f}"
                       f"   {h['rate_min']:,.0f}-{h['rate_max']:,.0f}")
        out.append("  how each peer hands a tensor over ((ns): allocated in a namespace: from its arena up to the"
                   "\n  daemon's --arena-max-tensor, 1 MiB by default; above, a dedicated buffer recycled for its"
                   "\n  producer):")
        for label, how in dict((h["peer"], h["via"]) for h in data["handoffs"]).items():
            out.append(f"    {label:<{width}}{how}")
    rounds = max((len(h["round_rates"]) for h in data["handoffs"]), default=1)
    out.append("\nTargets (ratios within this run" + (
        f"; a handoff rate is the median of {rounds} rounds, [the range]" if rounds > 1 else "") + ")")
    for t in data["targets"]:
        verdict = "info" if t["met"] is None else ("met" if t["met"] else "NOT met")
        out.append(f"  [{verdict:^7}] {t['target']}: {t['measured']} (required {t['required']}); {t['detail']}")
    print("\n".join(out))


def main():
    args = parse_args()
    runner = Runner(args)

    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)

    def log(message):
        print(f"[compare] {message}", file=sys.stderr, flush=True)

    sys.path.insert(0, os.path.join(args.build_dir, "python"))
    data = {"machine": machine_info(args), "cpp": {}, "first_acquire": {}, "handoffs": [], "repeated": {},
            "targets": []}
    try:
        if not args.skip_cpp:
            log(f"running {args.bench}" + (" --quick" if args.smoke else ""))
            data["cpp"] = {b["name"]: b for b in run_cpp(runner)}
            if not args.cpp_filter:
                log(f"running {args.bench}: the first-acquire parts, {args.rounds} interleaved repetitions")
                data["first_acquire"] = run_cpp_first_acquire(runner, args.rounds)
        runner.start_daemon()
        data["handoffs"], repeats = run_python(runner, log)
        data["repeated"] = {str(k): v for k, v in repeats.items()}
        data["targets"] = build_targets(data["cpp"], data["first_acquire"], data["handoffs"], repeats, args)
    finally:
        runner.close()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(data, f, indent=1)
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        print()
    else:
        print_table(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
