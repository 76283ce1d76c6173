#!/usr/bin/python3
"""One round of compare.py's handoff rows against TENSORD, with whatever tensord module
PYTHONPATH gives: one_side.py LABEL TENSORD -> JSON lines {label, row, rate}."""
import json, os, sys, types
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "bench"))
import compare_runner, compare_python  # noqa: E402
KIB, MIB = 1024, 1024 * 1024
label, path = sys.argv[1], sys.argv[2]
r = compare_runner.Runner(types.SimpleNamespace(tensord=path))
r.start_daemon()
peers = {p["label"]: p for p in compare_python.HANDOFF_PEERS}
rows = [("tensord single (ns)", 1, 1, 64 * MIB, 96, 1, 8), ("tensord single (ns)", 2, 2, 64 * MIB, 96, 1, 8),
        ("tensord single (ns)", 1, 1, 4 * KIB, 4096, 1, 128), ("tensord batched take (ns)", 1, 1, 4 * KIB, 4096, 64, 128),
        ("tensord single nowait (ns)", 1, 1, 4 * KIB, 4096, 1, 128)]
only = os.environ.get("ROWS")
if only: rows = [row for row in rows if any(o in row[0] and row[3] == 4 * KIB for o in only.split(","))]
try:
    for (peer, p, c, size, per, batch, window) in rows:
        f = compare_python.handoff(r, peers[peer], p, c, size, per, batch, window)
        print(json.dumps({"side": label, "row": f"{peer} {p}->{c} {size // KIB} KiB", "rate": f["rate"]}), flush=True)
finally:
    r.close()
