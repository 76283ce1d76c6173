"""CUDA handoffs, tensord against torch.multiprocessing, side by side in one run, on a real GPU.

    build/server/tensord --socket /tmp/b/tensord.sock &
    PYTHONPATH=build/client/python python3 tests/bench/cuda_handoff.py --socket /tmp/b/tensord.sock

For each size (--sizes, default 4 KiB and 64 MiB), a producer process makes a fresh float32
tensor per item on cuda:0 (filled on torch's current stream) and hands it to a consumer
process, which reads every element (a sum) and lets it go:
  torch.mp          the tensor through a torch.multiprocessing Queue (CUDA IPC; the producer
                    keeps each tensor until the consumer says it is done, as torch requires)
  tensord           what a steady producer writes: client.empty(..., device="cuda:0",
                    ns="handoff") per item, filled in place through torch.from_dlpack,
                    publish(stream=torch's stream); the consumer take()s the oldest, .torch()
                    orders its stream on the ready event, and the release waits for its done
                    event. From the second buffer on, the producer's items land in recycled
                    buffers the consumer keeps mapped: no driver call on either side.
  tensord (tuned)   the same, the producer connected with allocate_ahead=True (its next
                    empty() is asked for while it fills this one) and publishing with
                    wait=False (no round trip): what docs/performance.md suggests for a
                    steady producer
  tensord (no ns=)  the same as `tensord` without ns=: every item a fresh device
                    allocation, exported, imported and mapped by both sides, then freed
Prints `<label> <size>: N /s  G GB/s` per row and tensord's ratio to torch.mp per size.
Needs a CUDA build of torch and a GPU: otherwise it says so and exits 0. docs/gpu-runs/
keeps what each run on a GPU printed.
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
    result.put((n - 1, time.perf_counter() - start))  # the first item starts the clock


def tensord_producer(socket, count, elements, ns, prefix, tuned=False):
    import torch

    import tensord

    c = tensord.connect(socket, allocate_ahead=tuned)
    stream = torch.cuda.current_stream().cuda_stream
    for i in range(count):
        t = c.empty((elements,), "float32", device="cuda:0", ns=ns)
        torch.from_dlpack(t).fill_(float(i))
        c.publish(t, f"{prefix}/{i:08d}", stream=stream, wait=not tuned)
        t.release()
    c.flush()


def tensord_consumer(socket, count, prefix, result):
    import torch  # noqa: F401  loaded up front, as the torch.mp consumer has it: not timed

    import tensord

    c = tensord.connect(socket)
    start = None
    for _ in range(count):
        t = c.take(prefix + "/", timeout=None)
        if start is None:
            start = time.perf_counter()
        t.torch().sum().item()
        t.release()
    c.flush()
    result.put((count - 1, time.perf_counter() - start))


def size_label(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20}
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(text[:-len(unit)]) * scale
    raise argparse.ArgumentTypeError(f"a size like 4KiB or 64MiB, not {text!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--sizes", default="4KiB,64MiB", help="comma-separated, e.g. 4KiB,64MiB")
    parser.add_argument("--count", type=int, default=0,
                        help="items per row (default: 2000 up to 1 MiB, 400 above)")
    parser.add_argument("--no-plain", action="store_true", help="leave out the tensord (no ns=) rows")
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

    def run(label, nbytes, producer, consumer):
        """Starts producer(*producer[1:]) and consumer(*consumer[1:], result) as processes,
        prints the consumer's rate and returns it."""
        result = ctx.Queue()
        procs = [ctx.Process(target=producer[0], args=producer[1:]),
                 ctx.Process(target=consumer[0], args=(*consumer[1:], result))]
        for p in procs:
            p.start()
        try:
            n, seconds = result.get(timeout=600)
        except queue_module.Empty:
            for p in procs:
                p.kill()
            raise SystemExit(f"cuda_handoff: {label}: no result in 600 s (exit codes "
                             f"{[p.exitcode for p in procs]})") from None
        for p in procs:
            p.join()
        rate = n / seconds
        print(f"{label:9} {size_label(nbytes)}: {rate:.1f} /s  {rate * nbytes / 1e9:.2f} GB/s", flush=True)
        return rate

    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        elements = nbytes // 4
        count = args.count or (2000 if nbytes <= 1 << 20 else 400)
        queue, done = ctx.Queue(), ctx.Queue()
        mp_rate = run("torch.mp", nbytes, (torch_producer, queue, done, count, elements),
                      (torch_consumer, queue, done))
        rate = run("tensord", nbytes, (tensord_producer, args.socket, count, elements, "handoff", "handoff"),
                   (tensord_consumer, args.socket, count, "handoff"))
        print(f"{'':9} {size_label(nbytes)}: tensord / torch.mp = {rate / mp_rate:.2f}x", flush=True)
        tuned = run("tensord (tuned)", nbytes,
                    (tensord_producer, args.socket, count, elements, "tuned", "tuned", True),
                    (tensord_consumer, args.socket, count, "tuned"))
        print(f"{'':9} {size_label(nbytes)}: tensord (tuned) / torch.mp = {tuned / mp_rate:.2f}x", flush=True)
        if not args.no_plain:
            plain = run("tensord (no ns=)", nbytes,
                        (tensord_producer, args.socket, count, elements, None, "plain"),
                        (tensord_consumer, args.socket, count, "plain"))
            print(f"{'':9} {size_label(nbytes)}: tensord (no ns=) / torch.mp = {plain / mp_rate:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
