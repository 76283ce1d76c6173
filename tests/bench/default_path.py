#!/usr/bin/python3
"""What a torch user writes first, against torch.multiprocessing and the floor: fresh tensors
from one producer process to one consumer process, at most --window in flight (torch's
Queue(maxsize=window)), the consumer reading one byte of every page, side by side in one run.

    /usr/bin/python3 tests/bench/default_path.py --build-dir build-rel [--mib 64] [--rounds 3]

Rows (compare.py's handoff peers, peers.py):
  torch.mp file_system        a tensor in shared memory per item through Queue(window)
  tensord, README calls       client.empty(shape, dtype) (no ns=) + fill + publish(t, name)
                              -> take(prefix); a semaphore of `window` bounds the producer
  tensord queue               q = client.queue(prefix, depth=window); q.empty + fill +
                              q.publish -> q.get(): the queue bounds the producer
  tensord ns=                 the README calls with empty(..., ns=)
  floor                       fill + read of memory mapped before the clock
Each row is the median of --rounds runs, interleaved (the range follows). Prints the
transparent-huge-page setting, which moves every row (the targets in docs/performance.md
are for `never`).
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)


MIB = 1 << 20

PEERS = [
    {"label": "torch.mp file_system", "kind": "torch", "strategy": "file_system"},
    {"label": "tensord, README calls (no ns=)", "kind": "tensord-single", "ns": None},
    {"label": "tensord queue (depth = window)", "kind": "tensord-single", "queue": True},
    {"label": "tensord, empty(..., ns=)", "kind": "tensord-single", "ns": "h"},
    {"label": "floor", "kind": "floor"},
]


def thp():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build-dir", default=os.path.join(REPO, "build-rel"))
    p.add_argument("--mib", type=int, default=64, help="tensor size in MiB (default 64)")
    p.add_argument("--count", type=int, default=96, help="tensors per run (default 96)")
    p.add_argument("--window", type=int, default=4, help="tensors in flight at most (default 4)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--read-all", action="store_true",
                   help="consumers read every byte, not one per page (peers.py's READ_ALL)")
    args = p.parse_args()
    if args.read_all:
        os.environ["TENSORD_BENCH_READ_ALL"] = "1"  # before peers is imported below
    args.tensord = os.path.join(args.build_dir, "server", "tensord")
    import compare_python  # after READ_ALL is set: peers.py reads it once
    from compare_runner import Runner
    peers = [dict(peer, label=compare_python.FLOOR) if peer["kind"] == "floor" else peer for peer in PEERS]
    sys.path.insert(0, os.path.join(args.build_dir, "python"))
    size = args.mib * MIB
    runner = Runner(args)
    runs = {peer["label"]: [] for peer in peers}
    try:
        runner.start_daemon()
        for r in range(args.rounds):
            for peer in peers[r % len(peers):] + peers[:r % len(peers)]:
                print(f"[default_path] {peer['label']} (round {r + 1} of {args.rounds})", file=sys.stderr, flush=True)
                result = compare_python.handoff(runner, peer, 1, 1, size, args.count, 1, args.window)
                runs[peer["label"]].append(result["rate"])
    finally:
        runner.close()
    read = "every byte" if args.read_all else "one byte per page"
    print(f"{args.mib} MiB, 1 producer -> 1 consumer, at most {args.window} in flight, consumer reads {read}, "
          f"{args.count} tensors per run, median of {args.rounds} (range); THP {thp()}")
    medians = {label: statistics.median(rates) for label, rates in runs.items()}
    torch_rate, floor_rate = medians["torch.mp file_system"], medians[compare_python.FLOOR]
    for label, rates in runs.items():
        rate = medians[label]
        print(f"{label:34} {rate:8.1f} /s  ({min(rates):.1f}-{max(rates):.1f})  "
              f"{rate / torch_rate:5.2f}x torch.mp  {rate / floor_rate:5.2f}x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
