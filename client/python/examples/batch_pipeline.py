#!/usr/bin/python3
"""Preprocessing workers feed a trainer through tensord, without copying a batch.

Each worker process allocates its batches in broker memory (client.empty), fills them in
place through torch, and publishes them under PREFIX/. The trainer takes them oldest first
(client.take on the prefix: a zero-copy work queue), trains a small torch model on each, and
drops the batch when the step is done, which frees its memory in the broker. At the end
nothing is left under the prefix (each run queues under PREFIX/<trainer pid>/).

    tensord --socket /tmp/t.sock &
    TENSORD_SOCKET=/tmp/t.sock python3 batch_pipeline.py --workers 3 --batches 120
"""

import argparse
import multiprocessing
import os
import sys
import time

import torch

import tensord

FEATURES = 256
CLASSES = 10


def make_batch(seed, batch_size, out):
    """Fills out (batch_size x FEATURES+1, float32) in place: features, then the label."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (batch_size,), generator=g)
    out[:, :FEATURES].normal_(generator=g)
    out[:, :CLASSES] += torch.nn.functional.one_hot(labels, CLASSES) * 3  # learnable signal
    out[:, FEATURES] = labels.to(torch.float32)


def worker(index, workers, batches, batch_size, prefix, socket, max_queued):
    client = tensord.connect(socket, client_name=f"batch-worker-{index}")
    for seq in range(index, batches, workers):
        # Backpressure: stay at most max_queued batches ahead of the trainer.
        while len(client.list(prefix + "/")) >= max_queued:
            time.sleep(0.002)
        t = client.empty((batch_size, FEATURES + 1), "float32")
        make_batch(seq, batch_size, torch.from_dlpack(t))
        client.publish(t, f"{prefix}/w{index}-{seq:06d}")
        t.release()  # the name holds the batch now
    client.close()


def train(args):
    # Start the workers before this process connects: each worker opens its own session, and
    # a child forked from a process that already talks gRPC is fragile (see the README).
    prefix = f"{args.prefix}/{os.getpid()}"  # this run's queue
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=worker,
                         args=(i, args.workers, args.batches, args.batch_size, prefix,
                               args.socket, args.max_queued))
             for i in range(args.workers)]
    for p in procs:
        p.start()
    client = tensord.connect(args.socket, client_name="batch-trainer")

    model = torch.nn.Linear(FEATURES, CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    last_seq = {}
    in_order = True
    loss_value = float("nan")
    # On a terminal the progress line rewrites itself; in a log, one line per report.
    live = sys.stderr.isatty()
    start = time.monotonic()
    for step in range(1, args.batches + 1):
        batch = client.take(prefix + "/", timeout=args.timeout)
        worker_name, seq = batch.name.rsplit("/", 1)[1].split("-")
        in_order &= last_seq.get(worker_name, -1) < int(seq)
        last_seq[worker_name] = int(seq)
        data = batch.torch()  # zero copy: the broker's pages
        batch.release()  # the view keeps the lease until `data` goes
        x, y = data[:, :FEATURES], data[:, FEATURES].long()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_value = loss.item()
        del data, x, y  # the last views: the batch's memory goes back to the broker
        if step % 10 == 0 or step == args.batches:
            rate = step / (time.monotonic() - start)
            line = f"batch {step}/{args.batches}  loss {loss_value:.3f}  {rate:.1f} batches/s"
            if live:
                print("\r" + line, end="", file=sys.stderr, flush=True)
            else:
                print(line, file=sys.stderr, flush=True)
    elapsed = time.monotonic() - start
    if live:
        print(file=sys.stderr)
    for p in procs:
        p.join()
    client.flush()
    left = client.list(prefix + "/")
    mb = args.batches * args.batch_size * (FEATURES + 1) * 4 / 1e6
    print(f"trained on {args.batches} batches of {args.batch_size} from {args.workers} workers "
          f"in {elapsed:.2f} s: {args.batches / elapsed:.1f} batches/s, {mb / elapsed:.1f} MB/s "
          f"without copies; final loss {loss_value:.3f}; in order per worker: "
          f"{'yes' if in_order else 'NO'}; left behind: {len(left)} tensors")
    client.close()
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    return 0 if in_order and not left and not failed else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", help="tensord socket (default: $TENSORD_SOCKET, ...)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--batches", type=int, default=120)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--prefix", default="demo/batches")
    parser.add_argument("--max-queued", type=int, default=16,
                        help="how far the workers may run ahead of the trainer")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds the trainer waits for a batch")
    return train(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
