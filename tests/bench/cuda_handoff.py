"""A CUDA handoff, tensord against torch.multiprocessing, side by side, on a real GPU.

    build/server/tensord --socket /tmp/b/tensord.sock &
    PYTHONPATH=build/client/python python3 tests/bench/cuda_handoff.py --socket /tmp/b/tensord.sock

A producer process makes N float32 tensors of --mib MiB on cuda:0 (filled on torch's
current stream) and hands each to a consumer process, which reads every byte (a sum) and
lets it go:
  torch.mp   the tensor through a torch.multiprocessing Queue (CUDA IPC; the producer keeps
             each tensor until the consumer says it is done, as torch requires)
  tensord    client.empty(device="cuda:0"), filled in place through torch.from_dlpack,
             publish(stream=torch's stream); the consumer take()s it, .torch() orders its
             stream on the ready event, and the release waits for its done event
Prints handoffs/s and GB/s for each. Needs a CUDA build of torch and a GPU: otherwise it
says so and exits 0. docs/gpu-runs/ keeps what each run on a GPU printed.
"""

import argparse
import queue as queue_module
import sys
import time


def torch_producer(queue, done, count, elements):
    import torch

    for i in range(count):
        t = torch.full((elements,), float(i), device="cuda:0")
        queue.put(t)
        done.get()  # torch: the producer must keep a shared CUDA tensor until the consumer is done
    queue.put(None)


def torch_consumer(queue, done, result):
    import torch

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
    result.put((n, time.perf_counter() - start))


def tensord_producer(socket, count, elements):
    import torch

    import tensord

    c = tensord.connect(socket)
    stream = torch.cuda.current_stream().cuda_stream
    for i in range(count):
        t = c.empty((elements,), "float32", device="cuda:0")
        torch.from_dlpack(t).fill_(float(i))
        c.publish(t, f"handoff/{i:08d}", stream=stream)
        t.release()
    c.flush()


def tensord_consumer(socket, count, result):
    import torch  # noqa: F401  loaded up front, as the torch.mp consumer has it: not timed

    import tensord

    c = tensord.connect(socket)
    start = None
    for _ in range(count):
        t = c.take("handoff/", timeout=None)
        if start is None:
            start = time.perf_counter()
        t.torch().sum().item()
        t.release()
    c.flush()
    result.put((count, time.perf_counter() - start))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("cuda_handoff: no torch here: nothing measured")
        return 0
    if not torch.cuda.is_available():
        print(f"cuda_handoff: torch {torch.__version__} has no CUDA device here: nothing measured")
        return 0
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    elements = args.mib * (1 << 20) // 4
    nbytes = elements * 4

    def run(label, producer, consumer):
        """Starts producer(*producer[1:]) and consumer(*consumer[1:], result) as processes and
        prints the consumer's rate."""
        result = ctx.Queue()
        procs = [ctx.Process(target=producer[0], args=producer[1:]),
                 ctx.Process(target=consumer[0], args=(*consumer[1:], result))]
        for p in procs:
            p.start()
        try:
            n, seconds = result.get(timeout=300)
        except queue_module.Empty:
            for p in procs:
                p.kill()
            raise SystemExit(f"cuda_handoff: {label}: no result in 300 s (exit codes "
                             f"{[p.exitcode for p in procs]})") from None
        for p in procs:
            p.join()
        print(f"{label:9} {args.mib} MiB: {n / seconds:.1f} /s  {n * nbytes / seconds / 1e9:.2f} GB/s")

    queue, done = ctx.Queue(), ctx.Queue()
    run("torch.mp", (torch_producer, queue, done, args.count, elements), (torch_consumer, queue, done))
    run("tensord", (tensord_producer, args.socket, args.count, elements),
        (tensord_consumer, args.socket, args.count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
