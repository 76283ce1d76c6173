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

import pytest

import tensord

import ordered_handoff

torch = ordered_handoff.gpu_torch(pytest)

ELEMENTS = 1 << 22  # 16 MiB of float32

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


# The consumer's half of the stream-order test, as ordered_handoff runs it: it names itself
# (the broker then says when it waits), and reports whether its stream was still waiting
# for the producer's work when its comparison was queued.
TORCH_CONSUMER = """
import sys, torch, tensord
socket, name, n, shift = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
c = tensord.connect(socket, client_name="torch-consumer")
s = torch.cuda.Stream()
expected = torch.arange(n, device="cuda:0", dtype=torch.float32) + shift
with torch.cuda.stream(s):
    (expected == expected).all()  # the kernels below load now: a lazy load synchronizes the context
torch.cuda.synchronize()
t = c.get(name, timeout=120)
with torch.cuda.stream(s):
    x = torch.from_dlpack(t)  # __dlpack__(stream=s): s waits for the producer's ready event
    print("imported", flush=True)
    same = (x == expected).all()  # queued on s: no host sync yet
pending = not s.query()
print("values", bool(same))
print("pending", pending)
"""

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
    producer queues about 2 s of GPU work ahead of its write and publishes with its stream;
    the consumer reads at once, the producer's work still pending after its from_dlpack and
    its own stream still waiting for it, and sees the written values, with no host sync."""
    cuda_backend(client)
    lines = ordered_handoff.run(torch, broker, client, name, TORCH_CONSUMER, "torch-consumer")
    assert lines == ["imported", "values True", "pending True"], lines


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
