"""CUDA tensors from Python on a real GPU, with a CUDA build of torch: what the stand-in
tests (../cuda_fake) cannot show, because they never touch a GPU's memory. A torch
producer and a torch consumer in other processes, stream order with no host sync, a
producer that exits before its consumer reads, put() of a torch CUDA tensor, and pinned
takes feeding the GPU.

Skips, saying why, without a CUDA build of torch and a GPU (CI, Debian's torch). Run on a
GPU machine by tests/gpu/run-on-gpu.sh; docs/gpu-runs/ keeps what each run printed.
"""

import subprocess
import sys
import time

import pytest

import tensord

from ordered_handoff import gpu_torch, waiting_sessions

torch = gpu_torch(pytest)

ELEMENTS = 1 << 22  # 16 MiB of float32
SLEEP_CYCLES = 4_000_000_000  # about 2 s of GPU time (H100/H200 clocks) queued ahead of a write

PRODUCE_AND_EXIT = """
import sys, torch, tensord
c = tensord.connect(sys.argv[1])
t = c.empty((%d,), "float32", device="cuda:0")
torch.from_dlpack(t).copy_(torch.arange(%d, device="cuda:0", dtype=torch.float32))
c.publish(t, sys.argv[2], stream=torch.cuda.current_stream().cuda_stream)
torch.cuda.synchronize()  # the writes are done before this process and its context go
print("published", flush=True)
""" % (ELEMENTS, ELEMENTS)

CONSUME = """
import sys, torch, tensord
c = tensord.connect(sys.argv[1])
t = c.get(sys.argv[2])
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    x = torch.from_dlpack(t)  # __dlpack__(stream=s): s waits for the producer's ready event
    ok = bool(torch.equal(x, torch.arange(%d, device="cuda:0", dtype=torch.float32) + float(sys.argv[3])))
print(x.device, tuple(x.shape), ok, flush=True)
""" % ELEMENTS


# The consumer names itself, waits for the name, and reports whether its stream was still
# waiting for the producer's work when its read was queued (its query right after).
CONSUME_WAITING = """
import sys, torch, tensord
c = tensord.connect(sys.argv[1], client_name="stream-order-consumer")
s = torch.cuda.Stream()
expected = torch.arange(%d, device="cuda:0", dtype=torch.float32) + float(sys.argv[3])
with torch.cuda.stream(s):
    (expected == expected).all()  # the kernels below load now: a lazy load synchronizes the context
torch.cuda.synchronize()
t = c.get(sys.argv[2], timeout=60)
with torch.cuda.stream(s):
    x = torch.from_dlpack(t)  # __dlpack__(stream=s): s waits for the producer's ready event
    same = (x == expected).all()  # queued on s: no host sync yet
pending = not s.query()
print(x.device, tuple(x.shape), bool(same), flush=True)
print("pending", pending, flush=True)
""" % ELEMENTS

def cuda_backend(client):
    backend = next(b for b in client.status()["backends"] if b["name"] == "cuda")
    if not backend["available"]:
        pytest.fail(f"torch sees a GPU but tensord's cuda backend is unavailable: {backend}")
    return backend


def consume(broker, name, shift):
    out = subprocess.run([sys.executable, "-c", CONSUME, broker.socket, name, str(shift)],
                         env=broker.env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_tensor_outlives_its_torch_producer_and_a_torch_consumer_reads_it(broker, client, name):
    cuda_backend(client)
    n = name()
    out = subprocess.run([sys.executable, "-c", PRODUCE_AND_EXIT, broker.socket, n], env=broker.env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "published"
    assert consume(broker, n, 0) == f"cuda:0 ({ELEMENTS},) True"


def test_the_consumer_sees_what_the_producers_stream_wrote_with_no_host_sync_between(broker, client, name):
    """A consumer in another process waits for the name (the broker says so, no sleep); the
    producer queues about 2 s of GPU work ahead of its write, publishes with its stream and
    checks the work is still pending; the consumer reads at once, its stream still waiting
    for the producer's (it reports so), and sees the written values, with no host sync."""
    cuda_backend(client)
    t = client.empty((ELEMENTS,), "float32", device="cuda:0")
    x = torch.from_dlpack(t)
    values = torch.arange(ELEMENTS, device="cuda:0", dtype=torch.float32)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # once, so that no kernel loads lazily below while the sleep runs
        torch.cuda._sleep(1000)
        x.copy_(values + 7.0)
    s.synchronize()
    x.zero_()
    torch.cuda.synchronize()
    n = name()
    consumer = subprocess.Popen([sys.executable, "-c", CONSUME_WAITING, broker.socket, n, "7"], env=broker.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while waiting_sessions(client, "stream-order-consumer") == 0:
        assert consumer.poll() is None, consumer.communicate()[1]
        assert time.monotonic() < deadline, "the consumer never waited for the name"
        time.sleep(0.05)
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)  # a missing wait would read the zeros
        x.copy_(values + 7.0)
    client.publish(t, n, stream=s.cuda_stream)
    assert not s.query(), "the queued work finished before the publish: the test shows nothing"
    out, err = consumer.communicate(timeout=120)
    assert consumer.returncode == 0, err
    assert out.split("\n")[0:2] == ["cuda:0 (%d,) True" % ELEMENTS, "pending True"], out + err
    s.synchronize()


def test_put_copies_a_torch_cuda_tensor_on_the_gpu_and_get_gives_it_back_as_cuda(client, name):
    backend = cuda_backend(client)
    source = torch.randn(512, 256, device="cuda:0")
    n = name()
    info = client.put(n, source)
    assert info["device"] == (2, 0), info  # kDLCUDA, this process's ordinal
    t = client.get(n)
    assert t.__dlpack_device__() == (2, 0)
    y = t.torch()
    assert y.device == torch.device("cuda:0")
    assert y.data_ptr() != source.data_ptr()
    assert torch.equal(y, source)
    in_use = cuda_backend(client)["devices"][0]["bytes_in_use"]
    assert in_use >= source.numel() * 4, backend


def test_a_pinned_take_is_pinned_in_torch_and_copies_to_the_gpu(client, name):
    cuda_backend(client)
    host = torch.arange(ELEMENTS, dtype=torch.float32)
    n = name()
    client.put(n, host)
    t = client.take(n, pinned=True)
    assert t.__dlpack_device__() == (3, 0)  # kDLCUDAHost
    with pytest.warns(UserWarning, match="read-only"):
        x = t.torch()
    assert x.is_pinned(), "torch does not see the pinned view as pinned memory"
    on_gpu = x.to("cuda:0", non_blocking=True)
    torch.cuda.current_stream().synchronize()
    assert torch.equal(on_gpu.cpu(), host)


def test_a_recycled_buffer_stays_pinned_for_the_producers_next_batch(broker, name):
    producer = tensord.connect(broker.socket, lease_cache=False)
    trainer = tensord.connect(broker.socket, lease_cache=False, lease_cache_linger=30.0)
    pointers = []
    for i in range(4):
        t = producer.empty((ELEMENTS,), "float32", ns="py")
        torch.from_dlpack(t).fill_(float(i))
        producer.publish(t, f"py/q/{i:03d}")
        t.release()
        batch = trainer.take("py/q/", timeout=10, pinned=True)
        with pytest.warns(UserWarning, match="read-only"):
            x = batch.torch()
        assert x.is_pinned()
        pointers.append(x.data_ptr())
        assert float(x.to("cuda:0", non_blocking=True).sum()) == float(i) * ELEMENTS
        del x
        batch.release()
        trainer.flush()
        producer.flush()
    assert len(set(pointers)) < len(pointers), f"no batch reused a recycled buffer's pinned view: {pointers}"
    producer.close()
    trainer.close()
