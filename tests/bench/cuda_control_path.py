"""The control path of a CUDA handoff between two processes, without a GPU: what Python, the
client library and the broker cost per handoff when the driver's work costs nothing.

    TENSORD_LIBCUDA=build/tests/fake_cuda/libtensord_fake_cuda.so build/server/tensord --socket /tmp/c/t.sock &
    TENSORD_LIBCUDA=build/tests/fake_cuda/libtensord_fake_cuda.so PYTHONPATH=build/python \\
        /usr/bin/python3 tests/bench/cuda_control_path.py --socket /tmp/c/t.sock

Runs against the software stand-in for libcuda (tests/fake_cuda: "device memory" is host
memory, events complete at once), so the figures say nothing about a GPU; on a GPU,
tests/bench/cuda_handoff.py measures the same loops with torch writing and reading the
tensors. A producer process makes --count float32 tensors of 1024 elements on cuda:0 and
publishes each with a ready event; a consumer process takes each, orders a stream on it
(__dlpack__(stream=1)) and lets it go. Rows as in cuda_handoff.py: `steady` (empty(...,
ns=): recycled buffers), `tuned` (that, with allocate_ahead=True and publish(wait=False)),
`plain` (no ns=: a fresh allocation per item). Prints handoffs/s per row.
"""

import argparse
import multiprocessing
import os
import sys
import time


def producer(socket, count, ns, prefix, tuned):
    import tensord

    c = tensord.connect(socket, allocate_ahead=tuned)
    for i in range(count):
        t = c.empty((1024,), "float32", device="cuda:0", ns=ns)
        c.publish(t, f"{prefix}/{i:08d}", stream=1, wait=not tuned)
        t.release()
    c.flush()


def consumer(socket, count, prefix, result):
    import tensord

    c = tensord.connect(socket)
    start = None
    for _ in range(count):
        t = c.take(prefix + "/", timeout=None)
        if start is None:
            start = time.perf_counter()
        t.__dlpack__(stream=1)
        t.release()
    c.flush()
    result.put((count - 1) / (time.perf_counter() - start))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args()
    if not os.environ.get("TENSORD_LIBCUDA", "").endswith("libtensord_fake_cuda.so"):
        print("cuda_control_path: set TENSORD_LIBCUDA to the stand-in (tests/fake_cuda) for this process and "
              "the daemon; on a GPU, run cuda_handoff.py instead")
        return 0
    ctx = multiprocessing.get_context("spawn")
    for label, ns, tuned in (("steady", "steady", False), ("tuned", "tuned", True), ("plain", None, False)):
        prefix = label
        result = ctx.Queue()
        procs = [ctx.Process(target=producer, args=(args.socket, args.count, ns, prefix, tuned)),
                 ctx.Process(target=consumer, args=(args.socket, args.count, prefix, result))]
        for p in procs:
            p.start()
        rate = result.get(timeout=600)
        for p in procs:
            p.join()
        print(f"{label:7} {rate:8.0f} /s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
