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
docs/performance.md says what each row measures and how to read the targets. The parts live
beside this file: compare_runner.py (the daemon and the worker processes), compare_cpp.py,
compare_python.py (the experiments) and compare_table.py (the targets and the table).
"""

import argparse
import json
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from compare_cpp import run_cpp, run_cpp_first_acquire  # noqa: E402
from compare_python import run_python  # noqa: E402
from compare_runner import Runner  # noqa: E402
from compare_table import build_targets, machine_info, print_table  # noqa: E402

# batch_pipeline.py and handoff_steps.py use these as compare.MIB and compare.process_cpu (and
# compare.Runner and compare.machine_info above).
from compare_python import MIB  # noqa: E402,F401
from compare_runner import process_cpu  # noqa: E402,F401


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
