"""CUDA handoffs with the producer held to a window of items in flight, every call timed
inside the two-process pipeline: where a pipelined handoff spends its time, and whether a
bounded queue keeps the producer on recycled buffers.

    build/server/tensord --socket /tmp/b/tensord.sock &
    PYTHONPATH=build/python python3 tests/bench/cuda_handoff_window.py --socket /tmp/b/tensord.sock

Rows per size (--sizes, default 4 KiB and 64 MiB), each a producer process and a consumer
process as in cuda_handoff.py (fresh tensor per item, filled on torch's current stream; the
consumer reads every element and lets it go):
  torch.mp w=1      cuda_handoff.py's torch.mp row: the producer keeps each tensor until the
                    consumer says it is done (lock step)
  torch.mp w=N      the producer keeps up to N tensors in flight (torch's Queue(N) pattern)
  tensord w=0       cuda_handoff.py's `tensord` row (empty(..., ns=), publish, take): the
                    producer runs ahead without bound
  tensord w=N       the same, the producer holding a semaphore slot per item that the
                    consumer gives back after its release: a queue bounded at N items
  tensord+tuned w=N the same with allocate_ahead=True and publish(wait=False)
Each tensord row prints the p50 and p90 of every call on both sides (microseconds): a
recycled buffer's empty() is one round trip; a fresh one's is a device allocation and its
export, and the consumer's take then imports and maps it.

With the software stand-in for libcuda (TENSORD_LIBCUDA=tests/fake_cuda's library, no torch
needed) the torch rows and calls are left out: the figures are the control path's alone and
say nothing of a GPU.
"""

import argparse
import os
import queue as queue_module
import statistics
import sys
import time


def _quantiles(samples):
    ordered = sorted(samples)
    return ordered[len(ordered) // 2] / 1e3, ordered[(len(ordered) * 9) // 10] / 1e3


def torch_producer(queue, done, count, elements, window):
    import collections

    import torch

    kept = collections.deque()
    for i in range(count):
        if len(kept) >= window:
            done.get()
            kept.popleft()
        t = torch.full((elements,), float(i), device="cuda:0")
        kept.append(t)
        queue.put(t)
    queue.put(None)
    while kept:
        done.get()
        kept.popleft()


def torch_consumer(queue, done, result):
    n = 0
    start = None
    while True:
        t = queue.get()
        if t is None:
            break
        if start is None:
            start = time.perf_counter()
        t.sum().item()
        del t
        done.put(True)
        n += 1
    result.put(("consumer", n - 1, time.perf_counter() - start, {}))


def tensord_producer(socket, count, elements, room, fake, tuned, times):
    torch = None if fake else __import__("torch")
    import tensord

    c = tensord.connect(socket, allocate_ahead=tuned)
    stream = -1 if fake else torch.cuda.current_stream().cuda_stream
    calls = {"empty": [], "fill": [], "publish": [], "room": []}
    clock = time.perf_counter_ns
    for i in range(count):
        t0 = clock()
        if room is not None:
            room.acquire()
        t1 = clock()
        t = c.empty((elements,), "float32", device="cuda:0", ns="window")
        t2 = clock()
        if torch is not None:
            torch.from_dlpack(t).fill_(float(i))
        t3 = clock()
        c.publish(t, f"window/{i:08d}", stream=stream, wait=not tuned)
        t4 = clock()
        t.release()
        for key, value in (("room", t1 - t0), ("empty", t2 - t1), ("fill", t3 - t2), ("publish", t4 - t3)):
            calls[key].append(value)
    c.flush()
    times.put(("producer", calls))


def tensord_consumer(socket, count, room, fake, result):
    torch = None if fake else __import__("torch")
    import tensord

    c = tensord.connect(socket)
    calls = {"take": [], "read": [], "release": []}
    clock = time.perf_counter_ns
    start = None
    for _ in range(count):
        t0 = clock()
        t = c.take("window/", timeout=None)
        t1 = clock()
        if start is None:
            start = time.perf_counter()
        if torch is not None:
            t.torch().sum().item()
        t2 = clock()
        t.release()
        t3 = clock()
        if room is not None:
            room.release()
        for key, value in (("take", t1 - t0), ("read", t2 - t1), ("release", t3 - t2)):
            calls[key].append(value)
    c.flush()
    result.put(("consumer", count - 1, time.perf_counter() - start, calls))


def size_label(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--sizes", default="4096,67108864", help="bytes, comma-separated")
    parser.add_argument("--windows", default="0,2,4,8", help="tensord windows (0: unbounded)")
    parser.add_argument("--tuned-windows", default="0,4",
                        help="tensord windows with the tuned producer (allocate_ahead=True, publish(wait=False))")
    parser.add_argument("--torch-windows", default="1,4", help="torch.mp windows")
    parser.add_argument("--count", type=int, default=0, help="items per row (default: 2000 up to 1 MiB, 400 above)")
    args = parser.parse_args()
    fake = os.environ.get("TENSORD_LIBCUDA", "").endswith("libtensord_fake_cuda.so")
    if not fake:
        try:
            import torch
        except ImportError:
            print("cuda_handoff_window: no torch here and no stand-in: nothing measured")
            return 0
        if not torch.cuda.is_available():
            print("cuda_handoff_window: no CUDA device here: nothing measured")
            return 0
        import torch.multiprocessing as mp
    else:
        import multiprocessing as mp
        print("cuda_handoff_window: the software CUDA stand-in: control-path figures only, no GPU")
    ctx = mp.get_context("spawn")

    def run(label, nbytes, producer, consumer, timed):
        """Starts producer(*producer[1:]) (with a queue for its call times when `timed`) and
        consumer(*consumer[1:], result) as processes, prints the rate and the call times."""
        result, times = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=producer[0], args=(*producer[1:], times) if timed else producer[1:]),
                 ctx.Process(target=consumer[0], args=(*consumer[1:], result))]
        for p in procs:
            p.start()
        try:
            _, n, seconds, consumer_calls = result.get(timeout=600)
            producer_calls = times.get(timeout=60)[1] if timed else None
        except queue_module.Empty:
            for p in procs:
                p.kill()
            raise SystemExit(f"cuda_handoff_window: {label}: no result in 600 s") from None
        for p in procs:
            p.join()
        rate = n / seconds
        print(f"{label:17} {size_label(nbytes)}: {rate:.1f} /s", flush=True)
        for side, calls in (("producer", producer_calls), ("consumer", consumer_calls)):
            if not calls:
                continue
            parts = []
            for key, samples in calls.items():
                p50, p90 = _quantiles(samples[len(samples) // 10:])  # the first tenth is warm-up
                parts.append(f"{key} {p50:.1f}/{p90:.1f}")
            print(f"{'':17}   {side} p50/p90 us: " + ", ".join(parts), flush=True)
        return rate

    for nbytes in (int(s) for s in args.sizes.split(",")):
        elements = nbytes // 4
        count = args.count or (2000 if nbytes <= 1 << 20 else 400)
        baseline = None
        if not fake:
            for w in (int(x) for x in args.torch_windows.split(",")):
                queue, done = ctx.Queue(), ctx.Queue()
                rate = run(f"torch.mp w={w}", nbytes, (torch_producer, queue, done, count, elements, w),
                           (torch_consumer, queue, done), False)
                baseline = baseline or rate
        rows = [(w, False) for w in args.windows.split(",") if w] + [(w, True) for w in args.tuned_windows.split(",") if w]
        for w, tuned in ((int(w), tuned) for w, tuned in rows):
            room = ctx.Semaphore(w) if w > 0 else None
            label = f"tensord{'+tuned' if tuned else ''} w={w}"
            rate = run(label, nbytes, (tensord_producer, args.socket, count, elements, room, fake, tuned),
                       (tensord_consumer, args.socket, count, room, fake), True)
            if baseline:
                print(f"{'':17} {size_label(nbytes)}: {label} / torch.mp w=1 = {rate / baseline:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
