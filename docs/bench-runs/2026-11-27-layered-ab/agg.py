import json, statistics, sys, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith("{"):
        j = json.loads(line); d[(j["row"], j["side"])].append(j["rate"])
for (row, side), v in sorted(d.items()):
    print(f"{row:42} {side:7} median {statistics.median(v):9.1f}/s  range {min(v):.1f}-{max(v):.1f}  n={len(v)}")
