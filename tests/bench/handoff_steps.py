#!/usr/bin/python3
"""Where a large handoff's time goes: producers hand fresh tensors to consumers through
tensord, as compare.py's "tensord single (ns)" row does, and each side times its steps and
counts its CPU and context switches.

The producer: empty(ns) + fill in place + publish + release; the consumer: take(prefix) +
read one byte of every page + release, at most --window tensors in flight. After --warm
tensors (recycled buffers in place, mappings kept), each step's p50/p90/max over the rest,
each process's CPU, context switches and page faults per tensor (getrusage over the same tensors; the
daemon's CPU from /proc, over the whole run) and the rate the consumers saw together.
--producers and --consumers set N->M (default 1->1; each producer makes --count tensors,
which the consumers share evenly). --readonly takes read-only
(no copy-on-write, no scan for private pages before a release); --nowait publishes without
waiting for the broker's answer (publish(wait=False), flush() at the end), as compare.py's
"tensord single nowait (ns)" row does; --ahead connects the producer with
allocate_ahead=True (its next empty() is asked for while it fills this one). The daemon runs on a
private socket; every process is forked from this driver, which never connects.

Run with Debian's /usr/bin/python3 from the repository root:
    /usr/bin/python3 tests/bench/handoff_steps.py --build-dir build [--mib 64] [--readonly] [--nowait] [--ahead]
        [--producers N] [--consumers M]
docs/performance.md has figures from it.
"""

import argparse
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import compare  # noqa: E402  (the daemon runner, the CPU of a process)

PAGE = 4096


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"), help="the CMake build directory")
    p.add_argument("--mib", type=int, default=64, help="tensor size in MiB (default 64)")
    p.add_argument("--count", type=int, default=300, help="tensors per producer (default 300)")
    p.add_argument("--warm", type=int, default=20,
                   help="first tensors of each process left out of the figures (default 20)")
    p.add_argument("--window", type=int, default=8, help="tensors in flight at most, in all (default 8)")
    p.add_argument("--producers", type=int, default=1, help="producer processes (default 1)")
    p.add_argument("--consumers", type=int, default=1, help="consumer processes (default 1)")
    p.add_argument("--readonly", action="store_true", help="the consumer takes read-only")
    p.add_argument("--nowait", action="store_true", help="the producer publishes with wait=False")
    p.add_argument("--ahead", action="store_true", help="the producer connects with allocate_ahead=True")
    args = p.parse_args()
    if args.producers < 1 or args.consumers < 1:
        p.error("--producers and --consumers must be at least 1")
    if args.count * args.producers % args.consumers:
        p.error("--count * --producers must be a multiple of --consumers")
    args.per_consumer = args.count * args.producers // args.consumers
    if min(args.count, args.per_consumer) <= args.warm:
        p.error("every process must handle more than --warm tensors")
    return args


class Usage:
    """This process's CPU seconds and context switches since the last mark()."""

    def mark(self):
        self.start = resource.getrusage(resource.RUSAGE_SELF)

    def since(self):
        now = resource.getrusage(resource.RUSAGE_SELF)
        return {"cpu": now.ru_utime + now.ru_stime - self.start.ru_utime - self.start.ru_stime,
                "voluntary": now.ru_nvcsw - self.start.ru_nvcsw,
                "involuntary": now.ru_nivcsw - self.start.ru_nivcsw,
                "faults": now.ru_minflt - self.start.ru_minflt}


def producer(args, socket, slots, results, index):
    import tensord

    client = tensord.connect(socket, allocate_ahead=args.ahead)
    steps = {"empty": [], "fill": [], "publish": [], "release": []}
    n = args.mib << 20
    usage = Usage()
    for i in range(args.count):
        if i == args.warm:
            usage.mark()
        slots.acquire()
        t0 = time.perf_counter()
        t = client.empty((n,), "uint8", ns="steps")
        t1 = time.perf_counter()
        a = t.numpy()
        a.fill(i & 0xFF)
        del a
        t2 = time.perf_counter()
        client.publish(t, f"steps/q/{index}/{i}", wait=not args.nowait)
        t3 = time.perf_counter()
        t.release()
        t4 = time.perf_counter()
        if i >= args.warm:
            for step, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                steps[step].append(seconds)
    client.flush()  # raises if any publish failed
    results.put(("producer", {"steps": steps, "usage": usage.since(), "timed": args.count - args.warm}))


def consumer(args, socket, slots, results, index):
    import tensord

    client = tensord.connect(socket)
    steps = {"take": [], "read": [], "release": []}
    checksum = 0
    usage, start = Usage(), None
    for i in range(args.per_consumer):
        if i == args.warm:
            usage.mark()
            start = time.perf_counter()
        t0 = time.perf_counter()
        t = client.take("steps/q/", timeout=60.0, readonly=args.readonly)
        t1 = time.perf_counter()
        a = t.numpy()
        checksum += int(a[::PAGE].sum())
        del a
        t2 = time.perf_counter()
        t.release()
        t3 = time.perf_counter()
        slots.release()
        if i >= args.warm:
            for step, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2)):
                steps[step].append(seconds)
    timed = args.per_consumer - args.warm
    rate = timed / (time.perf_counter() - start)
    results.put(("consumer", {"steps": steps, "usage": usage.since(), "timed": timed, "rate": rate,
                              "checksum": checksum}))


def ms(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1e3


def main():
    args = parse_args()
    args.tensord = os.path.join(args.build_dir, "server", "tensord")
    runner = compare.Runner(args)  # the daemon on a private socket; close() stops everything
    try:
        runner.start_daemon()
        daemon = runner.popens[0]
        sys.path.insert(0, os.path.join(args.build_dir, "python"))
        slots, results = runner.ctx.Semaphore(args.window), runner.ctx.Queue()
        daemon_cpu0 = compare.process_cpu(daemon.pid)
        roles = [(consumer, i) for i in range(args.consumers)] + [(producer, i) for i in range(args.producers)]
        procs = [runner.ctx.Process(target=f, args=(args, runner.socket, slots, results, i), daemon=True)
                 for f, i in roles]
        runner.workers += procs
        for proc in procs:
            proc.start()
        got = {"producer": [], "consumer": []}
        for _ in procs:
            role, result = results.get(timeout=600)
            got[role].append(result)
        for proc in procs:
            proc.join()
        daemon_cpu = compare.process_cpu(daemon.pid) - daemon_cpu0
    finally:
        runner.close()
    pages = (args.mib << 20) // PAGE
    if sum(r["checksum"] for r in got["consumer"]) != args.producers * pages * sum(i & 0xFF for i in range(args.count)):
        raise RuntimeError("the consumers read the wrong data")
    how = "read-only takes" if args.readonly else "copy-on-write takes"
    if args.nowait:
        how += ", publish(wait=False)"
    if args.ahead:
        how += ", allocate_ahead"
    rate = sum(r["rate"] for r in got["consumer"])
    print(f"{args.mib} MiB, {args.producers}->{args.consumers}, {how}, {args.count} tensors per producer, "
          f"each process's first {args.warm} left out, window {args.window}")
    print(f"rate: {rate:.1f} tensors/s ({rate * (args.mib << 20) / 1e9:.2f} GB/s)")
    for role in ("producer", "consumer"):
        runs = got[role]
        timed = sum(r["timed"] for r in runs)
        usage = {key: sum(r["usage"][key] for r in runs) / timed for key in runs[0]["usage"]}
        print(f"{role} ({len(runs)}): per tensor CPU {usage['cpu'] * 1e3:.2f} ms, context switches "
              f"{usage['voluntary']:.1f} voluntary + {usage['involuntary']:.1f} involuntary, "
              f"page faults {usage['faults']:.1f}")
        for step in runs[0]["steps"]:
            values = [v for r in runs for v in r["steps"][step]]
            print(f"  {step:<8} p50 {ms(values, 0.5):7.2f} ms  p90 {ms(values, 0.9):7.2f} ms  "
                  f"max {ms(values, 1.0):7.2f} ms  mean {statistics.fmean(values) * 1e3:7.2f} ms")
    total = args.count * args.producers
    print(f"daemon: CPU {daemon_cpu / total * 1e3:.2f} ms per tensor (the whole run, start-up included)")


if __name__ == "__main__":
    main()
