#!/usr/bin/python3
"""Worker processes build batches for a training loop: DataLoader against tensord.

N worker processes fill image-like float32 batches with the same function (fill_batch: in
place into a tensor it is given, deterministic per batch index, every byte written) and hand
them to a trainer process that reads every byte of each batch (a full sum) and checks part of
it against what fill_batch makes for that index (a wrong byte fails the run). Four ways, in
one run, with the same workers and the same trainer step:
  DataLoader           torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=N,
                       prefetch_factor=P), otherwise its defaults: __getitem__ allocates the
                       batch with torch.empty and fills it; torch moves it to shared memory
                       to send it (a copy) and the trainer maps it
  DataLoader pinned    the same with pin_memory=True (without CUDA torch skips the pinning,
                       and the output says so)
  tensord              N processes: client.empty(shape, ns) + fill through torch.from_dlpack
                       + publish under NS/q/<worker>/<seq>; the trainer take()s the oldest
                       under NS/q/, reads it through .torch() and releases it; a semaphore
                       per worker keeps at most P batches of it ahead of the trainer, as
                       DataLoader's prefetch_factor does (--ahead: the workers connect with
                       allocate_ahead=True)
  tensord, README calls  the same with client.empty(shape, dtype), no ns=: what the README
                       shows first
Each run's trainer is a fresh process forked from this driver, which never connects to
anything: no process forks after it used gRPC, and every way starts from the same state.

Per way and batch shape: batches/s and GB/s over the time from starting the workers to the
end of the last training step (startup included: the first batches of a tensord worker also
allocate fresh buffers), and CPU seconds: the trainer's own (time.process_time, the same
interval), the workers' (RUSAGE_CHILDREN of the trainer after it reaped them: their whole
lives) and the daemon's (utime+stime in /proc, over the trainer's whole life; near zero for
the DataLoader ways). Then tensord's batches/s over DataLoader's, and the target of the
issue: at least 1.5x with the same workers. --repeat R runs every way R times, interleaved
and rotated; a row shows the median round and the range.

--device cuda:0 feeds a GPU trainer instead (a CUDA build of torch and a GPU): the trainer
copies each batch to the GPU and reads it there. DataLoader: batch.to(device); DataLoader
pinned: batch.to(device, non_blocking=True) from the pinned copy; tensord: take(pinned=True)
and batch.to(device, non_blocking=True) straight from the shared pages, registered with
CUDA once per recycled buffer. The driver never initialises CUDA (it forks the trainers):
torch's NVML check answers whether a GPU is there.

Run with Debian's /usr/bin/python3 (torch, numpy), from the repository root:
    /usr/bin/python3 tests/bench/batch_pipeline.py --build-dir build-rel
    /usr/bin/python3 tests/bench/batch_pipeline.py --smoke --build-dir build   # runs, no figures
"""

import argparse
import json
import math
import multiprocessing
import os
import resource
import signal
import statistics
import sys
import time
import traceback

# torch.cuda.is_available() by NVML, without initialising CUDA in the driver: a process that
# initialised CUDA cannot fork children that use it, and every trainer is forked from here.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402
import torch.utils.data  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import compare  # noqa: E402  (the daemon runner and the machine line)

TARGET = 1.5  # the issue: tensord at least this many times DataLoader's batches/s
CHECK = 64  # elements compared per checked slice

# ---- the batch: the same for every way ----

MEAN, STD = 0.45, 0.225


def transform_(x, index):
    """In place: pixel values (x mod 256) -> what a model sees: a contrast and brightness
    jitter deterministic in the batch index (a seeded random augmentation), then the
    normalization. Multiplies and adds only, so a slice computed alone has the same bits."""
    jitter = (index * 0.6180339887498949) % 1.0
    contrast, brightness = 0.8 + 0.4 * jitter, 0.1 * (jitter - 0.5)
    return x.remainder_(256.0).mul_(contrast / (255.0 * STD)).add_((brightness - MEAN) / STD)


def fill_batch(out, index):
    """Fills `out` (float32, contiguous, any shape) in place with batch `index`: element k
    is transform_((index + k) mod 256). Writes every byte; allocates nothing of that size."""
    flat = out.view(-1)
    torch.arange(index, index + flat.numel(), out=flat)  # exact: below 2**24
    transform_(flat, index)


def check_batch(batch, index):
    """Two slices of the batch (one placed by the index, and the last) against fill_batch's."""
    flat = batch.reshape(-1)
    n = flat.numel()
    for start in ((index * 104729) % (n - CHECK + 1), n - CHECK):
        want = transform_(torch.arange(index + start, index + start + CHECK, dtype=torch.float32), index)
        want = want.to(flat.device)
        if not torch.equal(flat[start:start + CHECK], want):
            raise RuntimeError(f"batch {index}: elements {start}..{start + CHECK - 1} are not what "
                               f"fill_batch wrote: {flat[start:start + 4].tolist()} vs {want[:4].tolist()}")


def train_step(batch, index, shape, device=None, non_blocking=False):
    """The trainer's work on a batch: on `device` when given (a copy there first, as a GPU
    trainer's batch.to(device)), read every byte (a full sum, as a first layer would), and
    check it. The sum's float() waits for the copy: the batch may be let go after."""
    if device is not None:
        batch = batch.to(device, non_blocking=non_blocking)
    if tuple(batch.shape) != shape or batch.dtype != torch.float32:
        raise RuntimeError(f"batch {index}: {batch.dtype} {tuple(batch.shape)}, not float32 {shape}")
    if not math.isfinite(float(batch.sum())):
        raise RuntimeError(f"batch {index}: its sum is not finite")
    check_batch(batch, index)


class Batches(torch.utils.data.Dataset):
    def __init__(self, shape, count):
        self.shape, self.count = shape, count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        out = torch.empty(self.shape, dtype=torch.float32)
        fill_batch(out, index)
        return index, out


# ---- the trainers: each runs in its own process and returns its measures ----

class Usage:
    """Wall clock, this process's CPU and its reaped children's CPU, at one moment."""

    def __init__(self):
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.wall = time.monotonic()
        self.cpu = time.process_time()
        self.children = children.ru_utime + children.ru_stime


def measures(start, end, reaped, cfg, seen):
    if sorted(seen) != list(range(cfg["batches"])):
        raise RuntimeError(f"the trainer got batches {sorted(seen)[:8]}..., not each of 0..{cfg['batches'] - 1} once")
    return {"seconds": end.wall - start.wall, "trainer_cpu": end.cpu - start.cpu,
            "workers_cpu": reaped.children - start.children}


def run_dataloader(cfg, pin_memory):
    shape = cfg["shape"]
    loader = torch.utils.data.DataLoader(Batches(shape, cfg["batches"]), batch_size=None,
                                         num_workers=cfg["workers"], prefetch_factor=cfg["prefetch"],
                                         pin_memory=pin_memory)
    seen = []
    start = Usage()
    batches = iter(loader)  # starts the workers
    for _ in range(cfg["batches"]):
        index, batch = next(batches)
        train_step(batch, index, shape, cfg["device"], non_blocking=pin_memory)
        seen.append(index)
        del batch
    end = Usage()
    if next(batches, None) is not None:  # exhausted: DataLoader joins its workers
        raise RuntimeError("DataLoader gave more batches than the dataset has")
    return measures(start, end, Usage(), cfg, seen)


def tensord_worker(cfg, worker, slot):
    import tensord

    torch.set_num_threads(1)  # as DataLoader's workers do
    client = tensord.connect(cfg["socket"], allocate_ahead=True) if cfg["ahead"] else tensord.connect(cfg["socket"])
    for seq, index in enumerate(range(worker, cfg["batches"], cfg["workers"])):
        slot.acquire()  # at most `prefetch` of this worker's batches ahead of the trainer
        t = client.empty(cfg["shape"], "float32", ns=None if cfg["plain"] else cfg["ns"])
        fill_batch(torch.from_dlpack(t), index)
        client.publish(t, f"{cfg['ns']}/q/{worker}/{seq:06d}")
        t.release()
    client.close()


def take(client, prefix, procs, pinned, timeout=60.0):
    """client.take(prefix, timeout, pinned), but failing within a second when a worker died."""
    import tensord

    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.take(prefix, timeout=1.0, pinned=pinned)
        except tensord.Timeout:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a tensord worker exited with status {dead[0]}") from None
            if time.monotonic() > deadline:
                raise


def run_tensord(cfg):
    cfg = dict({"plain": False}, **cfg)
    import warnings

    import tensord

    # A GPU trainer takes pinned views (read-only mappings: .torch() warns that torch cannot
    # mark them so; this trainer only reads).
    pinned = cfg["device"] is not None
    warnings.filterwarnings("ignore", message=".*read-only mapping.*", category=UserWarning)
    ctx = multiprocessing.get_context("fork")
    shape, workers = cfg["shape"], cfg["workers"]
    slots = [ctx.Semaphore(cfg["prefetch"]) for _ in range(workers)]
    procs = [ctx.Process(target=tensord_worker, args=(cfg, w, slots[w]), daemon=True) for w in range(workers)]
    seen = []
    start = Usage()
    for p in procs:
        p.start()
    client = tensord.connect(cfg["socket"])  # after the forks
    prefix = f"{cfg['ns']}/q/"
    for _ in range(cfg["batches"]):
        t = take(client, prefix, procs, pinned)
        worker, seq = (int(part) for part in t.name.rsplit("/", 2)[1:])
        index = worker + seq * workers
        batch = t.torch()
        train_step(batch, index, shape, cfg["device"], non_blocking=pinned)
        seen.append(index)
        del batch
        t.release()  # the last reference: the buffer goes back to its producer
        slots[worker].release()
    end = Usage()
    client.close()
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"a tensord worker ended with status {p.exitcode}")
    return measures(start, end, Usage(), cfg, seen)


WAYS = {
    "dataloader": ("DataLoader", lambda cfg: run_dataloader(cfg, False)),
    "dataloader-pinned": ("DataLoader pin_memory=True", lambda cfg: run_dataloader(cfg, True)),
    "tensord": ("tensord empty+publish -> take", run_tensord),
    # What the README shows first: empty(shape, dtype) without ns=.
    "tensord-plain": ("tensord, README calls (no ns=)", lambda cfg: run_tensord(dict(cfg, plain=True))),
}


def trainer(conn, way, cfg):
    os.setpgid(0, 0)  # its own group, with every worker it starts: the driver can stop them all
    try:
        conn.send(("ok", WAYS[way][1](cfg)))
    except BaseException:  # noqa: B036 - reported to the driver, which fails the run
        conn.send(("error", traceback.format_exc()))


# ---- the driver ----

def run_way(runner, way, cfg, timeout=600):
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=trainer, args=(send, way, cfg))
    daemon_pid = runner.popens[0].pid
    daemon_before = compare.process_cpu(daemon_pid)
    proc.start()
    send.close()  # a trainer that dies makes receive.poll() return at once
    try:
        os.setpgid(proc.pid, proc.pid)  # also here: the group exists before we might stop it
    except (PermissionError, ProcessLookupError):
        pass  # the trainer got there first, or has ended already
    label = WAYS[way][0]
    try:
        if not receive.poll(timeout):
            raise RuntimeError(f"{label}: the trainer did not finish in {timeout} s")
        try:
            status, result = receive.recv()
        except EOFError:
            raise RuntimeError(f"{label}: the trainer died without reporting (its output is above)") from None
        if status == "error":
            raise RuntimeError(f"{label} failed:\n{result}")
        proc.join(60)
        if proc.exitcode != 0:
            raise RuntimeError(f"{label}: the trainer ended with status {proc.exitcode}")
    except BaseException:
        try:  # the trainer and whatever it started
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        raise
    finally:
        proc.join()
    result["daemon_cpu"] = compare.process_cpu(daemon_pid) - daemon_before
    return result


def parse_shape(text):
    return tuple(int(x) for x in text.split("x"))


def shape_label(shape):
    nbytes = math.prod(shape) * 4
    amount = f"{nbytes / compare.MIB:.0f} MiB" if nbytes < 10 * compare.MIB else f"{nbytes / 1e6:.1f} MB"
    return f"{'x'.join(map(str, shape))} ({amount})"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", help="the CMake build directory (default: build-rel, else build)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--prefetch", type=int, default=2,
                   help="batches per worker ahead of the trainer (DataLoader's prefetch_factor; default 2)")
    p.add_argument("--sizes", default="64x3x224x224,64x4096", help="batch shapes, float32 (default "
                   "64x3x224x224,64x4096: 38.5 MB and 1 MiB)")
    p.add_argument("--batches", default=None,
                   help="batches per run, one number or one per size (default 48,1500; 8 with --smoke)")
    p.add_argument("--repeat", type=int, default=None,
                   help="rounds of every way, interleaved; a row shows the median (default 3, 1 with --smoke)")
    p.add_argument("--device", default=None,
                   help="feed a GPU trainer: copy each batch to this torch device (cuda:0) and read it "
                        "there (default: the trainer reads batches in host memory)")
    p.add_argument("--ahead", action="store_true",
                   help="tensord's workers connect with allocate_ahead=True (each next batch's buffer "
                        "is granted while the worker fills the last one)")
    p.add_argument("--json-out", help="also write the figures as JSON to this file")
    p.add_argument("--smoke", action="store_true",
                   help="tiny counts: checks that everything runs (figures mean nothing)")
    args = p.parse_args()
    if args.build_dir is None:
        rel = os.path.join(REPO, "build-rel")
        args.build_dir = rel if os.path.exists(os.path.join(rel, "server", "tensord")) else os.path.join(REPO, "build")
    args.tensord = os.path.join(args.build_dir, "server", "tensord")
    args.sizes = [parse_shape(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in (args.batches or ("8" if args.smoke else "48,1500")).split(",")]
    if len(batches) == 1:
        batches *= len(args.sizes)
    if len(batches) != len(args.sizes):
        p.error("--batches takes one number or one per size")
    args.batches = batches
    if args.repeat is None:
        args.repeat = 1 if args.smoke else 3
    if min(args.workers, args.prefetch, args.repeat, *batches) < 1:
        p.error("--workers, --prefetch, --repeat and --batches must be at least 1")
    if any(math.prod(s) < 2 * CHECK or math.prod(s) >= 2 ** 24 - max(batches) for s in args.sizes):
        p.error(f"a batch must have at least {2 * CHECK} elements, and fewer than 2**24 - batches "
                "(fill_batch counts in float32)")
    return args


def summarize(rounds, nbytes, batches):
    """The median round of one way and size, with the range of the rates."""
    rates = [batches / r["seconds"] for r in rounds]
    median = rounds[rates.index(statistics.median_low(rates))]
    rate = batches / median["seconds"]
    return {**median, "rate": rate, "gbps": rate * nbytes / 1e9, "rate_min": min(rates),
            "rate_max": max(rates), "round_rates": rates}


def build_targets(rows, args):
    targets = []
    for shape in args.sizes:
        by_way = {r["way"]: r for r in rows if r["shape"] == list(shape)}
        base = by_way["dataloader"]
        for way, label in (("tensord", "tensord"), ("tensord-plain", "tensord README calls (no ns=)")):
            ours = by_way[way]
            ratio = ours["rate"] / base["rate"]
            pinned = ours["rate"] / by_way["dataloader-pinned"]["rate"]
            targets.append({"target": f"{shape_label(shape)} batches/s, {args.workers} workers: {label} vs DataLoader",
                            "measured": f"{ratio:.3f}x", "required": f">= {TARGET:g}x", "met": ratio >= TARGET,
                            "detail": f"{rate_text(ours)} vs {rate_text(base)}; vs pin_memory=True {pinned:.3f}x"})
    return targets


def rate_text(row):
    spread = f" [{row['rate_min']:,.1f}-{row['rate_max']:,.1f}]" if len(row["round_rates"]) > 1 else ""
    return f"{row['rate']:,.1f}/s{spread}"


def print_table(data, args):
    m = data["machine"]
    out = [f"tensord batch pipeline: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, Linux {m['kernel']}, "
           f"python {m['python']}, torch {m['torch']}; commit {m['commit']}"
           + (f" with uncommitted changes to {', '.join(m['uncommitted'][:8])}" if m["uncommitted"] else "")
           + f"; load average before {m['load_before'][0]:.2f}"
           + ("  [SMOKE: figures mean nothing]" if args.smoke else "")]
    reads = (f"the trainer copies each to {args.device} and reads every byte there (tensord: pinned takes)"
             if args.device else "the trainer reads every byte of each")
    out.append(f"\n{args.workers} workers fill float32 batches, {reads}; at most "
               f"{args.prefetch} batches per worker ahead" + ("; tensord's workers allocate ahead" if args.ahead else "")
               + f"; the median of {args.repeat} round(s), and the range")
    out.append("  way                            batch                    batches  batches/s   range"
               "             GB/s   CPU s: trainer  workers  daemon")
    for r in data["rows"]:
        spread = f"{r['rate_min']:,.1f}-{r['rate_max']:,.1f}"
        out.append(f"  {WAYS[r['way']][0]:<31}{shape_label(tuple(r['shape'])):<25}{r['batches']:>7}"
                   f"{r['rate']:>11,.1f}   {spread:<15}{r['gbps']:>6.2f}{r['trainer_cpu']:>16.2f}"
                   f"{r['workers_cpu']:>9.2f}{r['daemon_cpu']:>8.2f}")
    out.append("  CPU s: the trainer's from time.process_time over the timed interval; the workers' from the\n"
               "  trainer's RUSAGE_CHILDREN after it reaped them (their whole lives); the daemon's from\n"
               "  /proc/<pid>/stat utime+stime over the trainer's whole life")
    if not data["cuda"]:
        out.append("  pin_memory=True had no effect here: torch.cuda.is_available() is False, so DataLoader "
                   "skips pinning (the row is DataLoader again)")
    out.append(f"\nTarget (the issue: tensord at least {TARGET:g}x DataLoader's batches/s with the same workers)")
    for t in data["targets"]:
        out.append(f"  [{'met' if t['met'] else 'NOT met':^7}] {t['target']}: {t['measured']} "
                   f"(required {t['required']}); {t['detail']}")
    print("\n".join(out))


def main():
    args = parse_args()

    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)

    def log(message):
        print(f"[batch_pipeline] {message}", file=sys.stderr, flush=True)

    sys.path.insert(0, os.path.join(args.build_dir, "python"))
    import tensord  # noqa: F401  (loaded once here, before any fork; nothing connects here)

    if args.device is not None and not (args.device.startswith("cuda") and torch.cuda.is_available()):
        sys.exit(f"batch_pipeline: --device {args.device}: torch {torch.__version__} sees no CUDA GPU here")
    runner = compare.Runner(args)
    data = {"machine": compare.machine_info(args), "cuda": torch.cuda.is_available(),
            "config": {"workers": args.workers, "prefetch": args.prefetch, "repeat": args.repeat,
                       "device": args.device},
            "rows": [], "targets": []}
    try:
        runner.start_daemon()
        ways = list(WAYS)
        for shape, batches in zip(args.sizes, args.batches):
            runs = {way: [] for way in ways}
            for r in range(args.repeat):
                # Rotated every round, so a slow spell of the machine lands on several ways.
                for way in ways[r % len(ways):] + ways[:r % len(ways)]:
                    runner.run_id += 1
                    log(f"{WAYS[way][0]}, {shape_label(shape)} x {batches} (round {r + 1} of {args.repeat})")
                    cfg = {"shape": shape, "batches": batches, "workers": args.workers, "device": args.device,
                           "prefetch": args.prefetch, "socket": runner.socket, "ns": f"bp{runner.run_id}",
                           "ahead": args.ahead}
                    runs[way].append(run_way(runner, way, cfg))
            for way in ways:
                data["rows"].append({"way": way, "shape": list(shape), "batches": batches,
                                     **summarize(runs[way], math.prod(shape) * 4, batches)})
        data["targets"] = build_targets(data["rows"], args)
    finally:
        runner.close()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(data, f, indent=1)
    print_table(data, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
