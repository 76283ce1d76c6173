#!/usr/bin/python3
"""Where a large handoff's time goes: one producer hands fresh tensors to one consumer
through tensord, as compare.py's "tensord single (ns)" row does, and each side times its
steps and counts its CPU.

The producer: empty(ns) + fill in place + publish + release; the consumer: take(prefix) +
read one byte of every page + release, at most --window tensors in flight. After --warm
tensors (recycled buffers in place, mappings kept), each step's p50/p90/max over the rest,
each process's CPU per tensor (time.process_time over the same tensors; the daemon's from
/proc, over the whole run) and the rate the consumer saw. --readonly takes read-only
(no copy-on-write, no scan for private pages before a release); --nowait publishes without
waiting for the broker's answer (publish(wait=False), flush() at the end), as compare.py's
"tensord single nowait (ns)" row does; --ahead connects the producer with
allocate_ahead=True (its next empty() is asked for while it fills this one). The daemon runs on a
private socket; every process is forked from this driver, which never connects.

Run with Debian's /usr/bin/python3 from the repository root:
    /usr/bin/python3 tests/bench/handoff_steps.py --build-dir build [--mib 64] [--readonly] [--nowait] [--ahead]
docs/performance.md has figures from it.
"""

import argparse
import os
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
    p.add_argument("--count", type=int, default=300, help="tensors in all (default 300)")
    p.add_argument("--warm", type=int, default=20, help="first tensors left out of the figures (default 20)")
    p.add_argument("--window", type=int, default=8, help="tensors in flight at most (default 8)")
    p.add_argument("--readonly", action="store_true", help="the consumer takes read-only")
    p.add_argument("--nowait", action="store_true", help="the producer publishes with wait=False")
    p.add_argument("--ahead", action="store_true", help="the producer connects with allocate_ahead=True")
    args = p.parse_args()
    if args.count <= args.warm:
        p.error("--count must be larger than --warm")
    return args


def producer(args, socket, slots, results):
    import tensord

    client = tensord.connect(socket, allocate_ahead=args.ahead)
    steps = {"empty": [], "fill": [], "publish": [], "release": []}
    n = args.mib << 20
    cpu0 = None
    for i in range(args.count):
        if i == args.warm:
            cpu0 = time.process_time()
        slots.acquire()
        t0 = time.perf_counter()
        t = client.empty((n,), "uint8", ns="steps")
        t1 = time.perf_counter()
        a = t.numpy()
        a.fill(i & 0xFF)
        del a
        t2 = time.perf_counter()
        client.publish(t, f"steps/q/{i}", wait=not args.nowait)
        t3 = time.perf_counter()
        t.release()
        t4 = time.perf_counter()
        if i >= args.warm:
            for step, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                steps[step].append(seconds)
    client.flush()  # raises if any publish failed
    results.put(("producer", steps, time.process_time() - cpu0, None))


def consumer(args, socket, slots, results):
    import tensord

    client = tensord.connect(socket)
    steps = {"take": [], "read": [], "release": []}
    checksum = 0
    cpu0 = start = None
    for i in range(args.count):
        if i == args.warm:
            cpu0, start = time.process_time(), time.perf_counter()
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
    rate = (args.count - args.warm) / (time.perf_counter() - start)
    pages = (args.mib << 20) // PAGE
    if checksum != pages * sum(i & 0xFF for i in range(args.count)):
        raise RuntimeError("the consumer read the wrong data")
    results.put(("consumer", steps, time.process_time() - cpu0, rate))


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
        procs = [runner.ctx.Process(target=f, args=(args, runner.socket, slots, results), daemon=True)
                 for f in (consumer, producer)]
        runner.workers += procs
        for proc in procs:
            proc.start()
        got = {}
        while len(got) < 2:
            role, steps, cpu, rate = results.get(timeout=600)
            got[role] = (steps, cpu, rate)
        for proc in procs:
            proc.join()
        daemon_cpu = compare.process_cpu(daemon.pid) - daemon_cpu0
    finally:
        runner.close()
    timed = args.count - args.warm
    how = "read-only takes" if args.readonly else "copy-on-write takes"
    if args.nowait:
        how += ", publish(wait=False)"
    if args.ahead:
        how += ", allocate_ahead"
    print(f"{args.mib} MiB, 1->1, {how}, {timed} tensors after {args.warm}, window {args.window}")
    print(f"rate: {got['consumer'][2]:.1f} tensors/s ({got['consumer'][2] * (args.mib << 20) / 1e9:.2f} GB/s)")
    for role in ("producer", "consumer"):
        steps, cpu, _ = got[role]
        print(f"{role}: CPU {cpu / timed * 1e3:.2f} ms per tensor")
        for step, values in steps.items():
            print(f"  {step:<8} p50 {ms(values, 0.5):7.2f} ms  p90 {ms(values, 0.9):7.2f} ms  "
                  f"max {ms(values, 1.0):7.2f} ms  mean {statistics.fmean(values) * 1e3:7.2f} ms")
    print(f"daemon: CPU {daemon_cpu / args.count * 1e3:.2f} ms per tensor (the whole run, start-up included)")


if __name__ == "__main__":
    main()
