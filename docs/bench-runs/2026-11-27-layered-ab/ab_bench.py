#!/usr/bin/python3
"""Interleaved A/B of compare.py's handoff rows against two daemons (same client, same peers):
ab_bench.py BEFORE_TENSORD AFTER_TENSORD ROUNDS. Prints each round and the medians."""
import os, statistics, sys, types
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "bench"))
import compare_runner, compare_python  # noqa: E402

KIB, MIB = 1024, 1024 * 1024
before, after, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
runners = {}
for label, path in (("before", before), ("after", after)):
    r = compare_runner.Runner(types.SimpleNamespace(tensord=path))
    r.start_daemon()
    runners[label] = r
peers = {p["label"]: p for p in compare_python.HANDOFF_PEERS}
rows = [("tensord single (ns)", 1, 1, 64 * MIB, 96, 1, 8), ("tensord single (ns)", 2, 2, 64 * MIB, 96, 1, 8),
        ("tensord single (ns)", 1, 1, 4 * KIB, 4096, 1, 128)]
rates = {}
try:
    for rnd in range(rounds):
        order = ["before", "after"] if rnd % 2 == 0 else ["after", "before"]
        for (label, p, c, size, per, batch, window) in rows:
            for which in order:
                f = compare_python.handoff(runners[which], peers[label], p, c, size, per, batch, window)
                key = (label, p, c, size, which)
                rates.setdefault(key, []).append(f["rate"])
                print(f"round {rnd + 1} {which:6} {label} {p}->{c} {size // KIB} KiB: {f['rate']:.1f}/s", flush=True)
finally:
    for r in runners.values():
        r.close()
print("\nmedians (range):")
for (label, p, c, size, which), values in sorted(rates.items()):
    print(f"  {label} {p}->{c} {size // KIB:>6} KiB {which:6}: {statistics.median(values):8.1f}/s "
          f"({min(values):.1f}-{max(values):.1f}, n={len(values)})")
