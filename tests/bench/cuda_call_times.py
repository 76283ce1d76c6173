"""Where a Python CUDA handoff spends its time: each call of the producer and the consumer
timed on its own, in lock step, in one process with two clients (no pipelining, so each
figure is that call's own latency, not its share of a pipelined rate).

    build/server/tensord --socket /tmp/b/tensord.sock &
    PYTHONPATH=build/python python3 tests/bench/cuda_call_times.py --socket /tmp/b/tensord.sock

Per size (--sizes, default 4 KiB and 64 MiB): 200 items of warm-up, then --count items of
empty(..., ns=) on cuda:0, fill through torch.from_dlpack, publish(stream=torch's stream),
release; take, .torch() (on odd items taken apart: torch's current stream, __dlpack__ with
it, torch's from_dlpack of the capsule), sum().item(), release. Prints each step's p50 and
mean in microseconds. With the software stand-in for libcuda (TENSORD_LIBCUDA=tests/fake_cuda's
library; no torch needed) the torch steps are left out and the figures are the control
path's alone. cuda_handoff.py measures the pipelined rates.
"""

import argparse
import os
import statistics
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--sizes", default="4096,67108864", help="bytes, comma-separated")
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args()
    fake = os.environ.get("TENSORD_LIBCUDA", "").endswith("libtensord_fake_cuda.so")
    torch = None
    if not fake:
        try:
            import torch
        except ImportError:
            print("cuda_call_times: no torch here and no stand-in: nothing measured")
            return 0
        if not torch.cuda.is_available():
            print("cuda_call_times: no CUDA device here: nothing measured")
            return 0
    import tensord

    producer, consumer = tensord.connect(args.socket), tensord.connect(args.socket)
    stream = torch.cuda.current_stream().cuda_stream if torch else 1
    for nbytes in (int(s) for s in args.sizes.split(",")):
        steps = {}

        def timed(name, f, record):
            start = time.perf_counter()
            value = f()
            if record:
                steps.setdefault(name, []).append(time.perf_counter() - start)
            return value

        for i in range(200 + args.count):
            record = i >= 200
            t = timed("empty", lambda: producer.empty((nbytes // 4,), "float32", device="cuda:0", ns="steps"), record)
            if torch:
                view = timed("torch.from_dlpack(t)", lambda: torch.from_dlpack(t), record)
                timed("fill_", lambda: view.fill_(float(i)), record)
                del view
            timed("publish", lambda: producer.publish(t, f"steps/{i:08d}", stream=stream), record)
            timed("release (producer)", t.release, record)
            got = timed("take", lambda: consumer.take("steps/", timeout=None), record)
            if torch and i % 2 == 0:
                view = timed(".torch() (even items)", got.torch, record)
            elif torch:  # what .torch() does, step by step
                current = timed("current_stream() (odd)", torch.cuda.current_stream, record)
                capsule = timed("__dlpack__(stream=) (odd)", lambda: got.__dlpack__(stream=current.cuda_stream or 1), record)
                view = timed("from_dlpack(capsule) (odd)", lambda: torch.utils.dlpack.from_dlpack(capsule), record)
                del capsule
            if torch:
                timed("sum().item()", lambda: view.sum().item(), record)
                del view
            else:
                timed("__dlpack__(stream=1)", lambda: got.__dlpack__(stream=1), record)
            timed("release (consumer)", got.release, record)
        print(f"{nbytes} bytes, {args.count} items{' (stand-in: not a GPU)' if fake else ''}:")
        total = 0.0
        for name, values in steps.items():
            if "(odd)" not in name:  # the odd items' steps stand in for .torch() on the even ones
                total += statistics.mean(values)
            print(f"  {name:28} p50 {statistics.median(values) * 1e6:8.1f} us  mean {statistics.mean(values) * 1e6:8.1f} us")
        print(f"  {'sum of means':28} {total * 1e6:17.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
