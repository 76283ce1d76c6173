"""compare.py's output: the machine line, the targets (ratios within one run), and the table
of every figure.
"""

import os
import platform
import statistics
import subprocess

from compare_cpp import FIRST_ACQUIRE_PARTS
from compare_python import FLOOR, KIB, MIB, STEADY, handoff_sizes, size_label

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
