"""compare.py's C++ benchmark: tensord_bench (Google Benchmark) run as a program, its JSON
read back, and the first-acquire parts measured again in interleaved repetitions.
"""

import json
import re
import subprocess

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
