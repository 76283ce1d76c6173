"""CUDA tensors from Python through the daemon, with libtensord_fake_cuda.so standing in for
libcuda (tests/fake_cuda/README.md): the plumbing between processes, never a GPU. Run by
`ctest -L cuda-fake` (python_cuda_fake_tests), which points TENSORD_LIBCUDA at the stand-in
for this process, the daemon and the children. Debian's torch has no CUDA, so the bytes are
not read here; tests/integration/cuda/ reads them through the driver API.
"""

import os
import subprocess
import sys

import pytest

import tensord
from conftest import session_waiting, wait_for

if not os.environ.get("TENSORD_LIBCUDA", "").endswith("libtensord_fake_cuda.so"):
    pytest.skip(
        "needs the stand-in libcuda: run `ctest -L cuda-fake` (it sets TENSORD_LIBCUDA)",
        allow_module_level=True,
    )

CONSUMER = """
import sys, tensord
c = tensord.connect(sys.argv[1])
t = c.get(sys.argv[2])
print(t.__dlpack_device__(), t.shape, t.dtype)
try:
    t.numpy()
except TypeError as e:
    print("numpy refused:", e)
"""


def cuda_backend(client):
    return next(b for b in client.status()["backends"] if b["name"] == "cuda")


def test_empty_on_a_gpu_is_named_by_uuid_and_seen_under_each_processes_ordinal(broker, client, name):
    backend = cuda_backend(client)
    assert backend["available"], backend
    assert [d["device_id"] for d in backend["devices"]] == [0, 1]
    second = backend["devices"][1]["uuid"]
    assert second.startswith("GPU-")

    t = client.empty((4, 8), "float32", device="cuda:1")
    assert t.__dlpack_device__() == (2, 1)
    with pytest.raises(TypeError, match="numpy cannot read it"):
        t.numpy()
    n = name()
    client.publish(t, n)
    assert cuda_backend(client)["devices"][1]["bytes_in_use"] == 2 << 20

    env = broker.env()
    env["CUDA_VISIBLE_DEVICES"] = second
    out = subprocess.run([sys.executable, "-c", CONSUMER, broker.socket, n], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "(2, 0) (4, 8) float32", out.stdout
    assert lines[1].startswith("numpy refused:"), out.stdout


def test_device_names_and_errors(client):
    assert tensord._client.device_tuple(None) == (1, 0)
    assert tensord._client.device_tuple("cuda") == (2, 0)
    assert tensord._client.device_tuple("cuda:3") == (2, 3)
    assert tensord._client.device_tuple((2, 1)) == (2, 1)
    with pytest.raises(ValueError, match="give 'cpu', 'cuda', 'cuda:N'"):
        tensord._client.device_tuple("gpu0")
    # The stand-in has two GPUs: this process has no third.
    with pytest.raises(tensord.Error, match="no cuda device 5 in this process"):
        client.empty((4,), "float32", device="cuda:5")


# Pinned host views: a host tensor registered with cuMemHostRegister (the stand-in records
# the registration; nothing is page-locked).

def fake_host_registrations():
    """Live cuMemHostRegister ranges of this process, as the stand-in counts them."""
    import ctypes
    fake = ctypes.CDLL(os.environ["TENSORD_LIBCUDA"])  # the copy the client loaded
    fake.tensord_fake_cuda_live_objects.restype = ctypes.c_int
    return fake.tensord_fake_cuda_live_objects(b"host_register")


def wait_for_registrations(count, seconds=10.0):
    import time
    deadline = time.monotonic() + seconds
    while fake_host_registrations() != count and time.monotonic() < deadline:
        time.sleep(0.02)
    return fake_host_registrations()


def test_a_pinned_get_is_a_read_only_cuda_host_view_of_the_same_memory(client, name):
    import numpy as np
    import torch

    n = name()
    client.put(n, np.arange(1000, dtype=np.float32) * 0.5)
    before = fake_host_registrations()
    t = client.get(n, pinned=True)
    assert t.__dlpack_device__() == (3, 0)
    assert t.device == (3, 0)
    assert t.pinned and t.readonly
    assert fake_host_registrations() == before + 1

    a = t.numpy()  # host memory: numpy reads it in place
    assert not a.flags.writeable
    assert np.array_equal(a, np.arange(1000, dtype=np.float32) * 0.5)

    # Debian's torch refuses kDLCUDAHost over DLPack ("Unsupported device_type: 3"); .torch()
    # hands it the CPU tensor it is, over the same pages (read-only: it warns).
    with pytest.warns(UserWarning, match="read-only mapping"):
        tt = t.torch()
    assert tt.device.type == "cpu"
    assert tt.data_ptr() == a.ctypes.data
    assert torch.equal(tt, torch.arange(1000, dtype=torch.float32) * 0.5)

    # A legacy capsule cannot say read-only: refused, saying how to get one.
    with pytest.raises(BufferError, match="pinned=True"):
        t.__dlpack__()

    # An unpinned get of the same tensor is another mapping, unregistered.
    plain = client.get(n)
    assert plain.__dlpack_device__() == (1, 0)
    assert fake_host_registrations() == before + 1

    # The registration goes with the last view (after the lease cache lets go).
    del a, tt
    t.release()
    plain.release()
    client.flush()
    assert wait_for_registrations(before) == before


def test_get_many_pins_each_and_a_gpu_tensor_is_refused_by_name(client, name):
    import numpy as np

    a, b = name(), name()
    client.put(a, np.ones(8, dtype=np.int32))
    client.put(b, np.zeros(8, dtype=np.int32))
    pinned = client.get_many([a, b], pinned=True)
    assert [t.__dlpack_device__() for t in pinned] == [(3, 0), (3, 0)]
    assert pinned[0].numpy().tolist() == [1] * 8
    by_id = client.get(pinned[1].tensor_id, pinned=True)
    assert by_id.__dlpack_device__() == (3, 0)
    assert by_id.numpy().tolist() == [0] * 8

    g = name()
    client.publish(client.empty((4,), "float32", device="cuda:0"), g)
    with pytest.raises(tensord.InvalidArgument, match=f"'{g}'.*a pinned view is of host memory"):
        client.get(g, pinned=True)


def test_take_and_take_many_pin_when_asked_and_a_gpu_tensor_stays_bound(client, name):
    import numpy as np

    queue = name("q") + "/"
    for i in range(3):
        client.put(f"{queue}{i}", np.full(8, i, dtype=np.int32))
    before = fake_host_registrations()
    first = client.take(queue, pinned=True)
    assert first.__dlpack_device__() == (3, 0) and first.pinned and first.readonly
    assert first.numpy().tolist() == [0] * 8
    assert fake_host_registrations() == before + 1
    rest = client.take_many(queue, 5, pinned=True)
    assert [t.__dlpack_device__() for t in rest] == [(3, 0), (3, 0)]
    assert [int(t.numpy()[0]) for t in rest] == [1, 2]
    client.put(f"{queue}3", np.zeros(2, dtype=np.int32))
    assert client.take(queue).__dlpack_device__() == (1, 0)  # unpinned unless asked

    # A take cannot be undone: the broker refuses a GPU tensor to a pinned take before it
    # unbinds anything, for a name, a prefix and a batch alike.
    g = name("g")
    client.publish(client.empty((4,), "float32", device="cuda:0"), f"{g}/0")
    with pytest.raises(tensord.InvalidArgument, match="DEVICE_TYPE_CUDA memory and this take maps only "
                                                      "DEVICE_TYPE_CPU memory; it stays bound"):
        client.take(f"{g}/0", pinned=True)
    with pytest.raises(tensord.InvalidArgument, match="it stays bound"):
        client.take(f"{g}/", pinned=True)
    with pytest.raises(tensord.InvalidArgument, match="it stays bound"):
        client.take_many(f"{g}/", 3, pinned=True)
    assert [e["name"] for e in client.list(f"{g}/")] == [f"{g}/0"]
    assert client.take(f"{g}/").__dlpack_device__() == (2, 0)


def test_a_waiting_pinned_take_is_refused_a_gpu_tensor_and_it_stays_bound(client, other, name):
    import threading

    q = name("w") + "/"
    errors = []

    def taker():
        try:
            client.take(q, timeout=30, pinned=True)
        except tensord.InvalidArgument as e:
            errors.append(str(e))

    thread = threading.Thread(target=taker)
    thread.start()
    try:
        # Published while the take waits at the broker, not before it got there.
        wait_for(lambda: session_waiting(other, client.session_id) == 1,
                 what="the pinned take to wait at the broker")
    finally:
        other.publish(other.empty((4,), "float32", device="cuda:0"), f"{q}0")
        thread.join(30)
    assert errors and "it stays bound" in errors[0], errors
    assert [e["name"] for e in other.list(q)] == [f"{q}0"]


NO_DRIVER = """
import sys, numpy, tensord
c = tensord.connect(sys.argv[1])
try:
    c.get(sys.argv[2], pinned=True)
except tensord.Unavailable as e:
    print("unavailable:", e)
print(c.get(sys.argv[2]).numpy().tolist())
try:
    c.take(sys.argv[2], pinned=True)
except tensord.Unavailable as e:
    print("take unavailable:", e)
print(c.take(sys.argv[2]).numpy().tolist())  # the refused pinned take left it bound
"""


def test_without_a_driver_a_pinned_get_says_why_and_plain_gets_work(broker, client, name):
    import numpy as np

    n = name()
    client.put(n, np.arange(4, dtype=np.float32))
    env = broker.env()
    env["TENSORD_LIBCUDA"] = "/nonexistent/libcuda-missing.so.1"
    out = subprocess.run([sys.executable, "-c", NO_DRIVER, broker.socket, n], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # The client logs once that the driver is unavailable ("[date] [info] cuda: ...").
    lines = [line for line in out.stdout.splitlines() if "] [info] " not in line]
    assert lines[0].startswith("unavailable:"), out.stdout
    assert "a pinned view needs the cuda driver" in lines[0], out.stdout
    assert "no NVIDIA driver on this machine" in lines[0], out.stdout
    assert lines[1] == "[0.0, 1.0, 2.0, 3.0]", out.stdout
    assert lines[2].startswith("take unavailable:") and "a pinned view needs the cuda driver" in lines[2], out.stdout
    assert lines[3] == "[0.0, 1.0, 2.0, 3.0]", out.stdout


def fake_driver():
    import ctypes

    return ctypes.CDLL(os.environ["TENSORD_LIBCUDA"])


def device_pointer(t):
    """The device address a tensord tensor's DLPack view points at (the stand-in's device
    memory is host memory, so the test may read and write it there)."""
    import ctypes

    capsule = t.__dlpack__(stream=-1)  # no ordering asked: only the pointer is read
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    managed = get(capsule, b"dltensor")
    data = ctypes.c_void_p.from_address(managed).value  # DLTensor.data, the first field
    return data  # the capsule, never consumed, gives its reference back when it goes


def test_put_copies_a_cuda_source_device_to_device_and_dlpack_streams_wait_for_it(client, name):
    import ctypes

    import numpy as np

    source = client.empty((256,), "float32", device="cuda:0")
    values = np.arange(256, dtype=np.float32) * 0.5
    ctypes.memmove(device_pointer(source), values.ctypes.data, values.nbytes)
    n = name()
    info = client.put(n, source)  # a kDLCUDA source: cuMemcpyDtoDAsync, no host round trip
    assert tuple(info["device"]) == (2, 0)
    copy = client.get(n)
    assert copy.__dlpack_device__() == (2, 0)
    assert device_pointer(copy) != device_pointer(source)
    got = np.empty(256, dtype=np.float32)
    ctypes.memmove(got.ctypes.data, device_pointer(copy), got.nbytes)
    assert np.array_equal(got, values)

    # DLPack's stream protocol: the consumer's stream waits on the put's ready event (this
    # process recorded it, so on its own event), once per __dlpack__ with a stream.
    waits = fake_driver().tensord_fake_cuda_stream_waits
    waits.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    before = waits(0x7777, 0, 0)
    copy.__dlpack__(stream=0x7777)
    copy.use_on_stream(0x7777)
    assert waits(0x7777, 0, 0) == before + 2
    with pytest.raises(ValueError, match="stream 0 is ambiguous"):
        copy.__dlpack__(stream=0)

    # put_many copies host arrays only, and says so.
    with pytest.raises(ValueError, match="put_many copies host arrays"):
        client.put_many({name(): source})


RECYCLED_CONSUMER = """
import ctypes, os, sys, tensord
fake = ctypes.CDLL(os.environ["TENSORD_LIBCUDA"])
fake.tensord_fake_cuda_calls.argtypes = [ctypes.c_char_p]
c = tensord.connect(sys.argv[1], lease_cache=False, lease_cache_linger=30.0)
for k in range(int(sys.argv[2])):
    t = c.take("rc/", timeout=None)
    first = ctypes.c_float.from_address(device_pointer(t) + 4 * 5).value  # element 5: 2.5 + k
    buffer_id = t.info["buffer_id"]
    t.release()
    c.flush()  # let go before saying so: the producer's next empty() finds the buffer pooled
    print(k, buffer_id, first == 2.5 + k, flush=True)
print(*(fake.tensord_fake_cuda_calls(s) for s in
        (b"cuMemImportFromShareableHandle", b"cuIpcOpenEventHandle", b"cuStreamWaitEvent")), flush=True)
"""


def test_a_recycled_gpu_buffer_is_written_again_and_read_with_no_new_import(broker, client, name):
    """What a steady torch producer writes: empty(..., device=, ns=) each time, fill, publish
    with its stream; a consumer in another process takes each one. From the second item on,
    the producer gets the same buffer back and the consumer reads it through the import and
    the opened ready event it kept."""
    import ctypes
    import inspect

    items = 5
    source = inspect.getsource(device_pointer)
    consumer = subprocess.Popen([sys.executable, "-c", source + RECYCLED_CONSUMER, broker.socket, str(items)],
                                env=broker.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    buffers = set()
    try:
        for k in range(items):
            t = client.empty((1024,), "float32", device="cuda:0", ns="rc")
            buffers.add(t.info["buffer_id"])
            values = (ctypes.c_float * 1024)(*[i * 0.5 + k for i in range(1024)])
            ctypes.memmove(device_pointer(t), values, ctypes.sizeof(values))
            client.publish(t, f"rc/{k}", stream=1)  # a ready event on the legacy stream
            t.release()
            client.flush()  # the producer's own lease is gone before the consumer lets go
            assert consumer.stdout.readline().split()[2] == "True", consumer.stderr.read()
        calls = consumer.stdout.readline().split()
    finally:
        out, err = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, err
    assert len(buffers) == 1, f"the producer got new buffers: {buffers}"
    imports, opens, waits = map(int, calls)
    assert (imports, opens) == (1, 1), calls
    assert waits == items, calls  # each take orders the legacy stream once


HELD_PRODUCER = """
import ctypes, os, sys, tensord
fake = ctypes.CDLL(os.environ["TENSORD_LIBCUDA"])
c = tensord.connect(sys.argv[1])
t = c.empty((256,), "float32", device="cuda:0")
fake.tensord_fake_cuda_hold_streams(1)  # the GPU has not run the producer's work yet
c.publish(t, sys.argv[2], stream=1)
print("published", flush=True)
sys.stdin.readline()
print("finished", fake.tensord_fake_cuda_finish_streams(), flush=True)
sys.stdin.readline()
"""


def test_to_dlpack_waits_on_the_host_until_the_producers_work_is_done(broker, client, name):
    """TensorFlow passes no stream, so to_dlpack() must not return before the producer's
    writes are done: it blocks in a host wait on the producer's ready event (the stand-in's
    cuEventSynchronize) until the producer's GPU work finishes."""
    import ctypes
    import threading

    n = name()
    producer = subprocess.Popen([sys.executable, "-c", HELD_PRODUCER, broker.socket, n], env=broker.env(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert producer.stdout.readline().strip() == "published", producer.stderr.read()
        t = client.get(n)
        calls = fake_driver().tensord_fake_cuda_calls
        calls.argtypes = [ctypes.c_char_p]
        syncs = calls(b"cuEventSynchronize")
        result = {}
        waiter = threading.Thread(target=lambda: result.setdefault("capsule", t.to_dlpack()))
        waiter.start()
        wait_for(lambda: calls(b"cuEventSynchronize") > syncs, what="to_dlpack's host wait")
        assert waiter.is_alive() and not result, "to_dlpack returned before the producer's work was done"
        producer.stdin.write("\n")
        producer.stdin.flush()
        assert producer.stdout.readline().split() == ["finished", "1"]
        waiter.join(timeout=30)
        assert not waiter.is_alive(), "to_dlpack still waits after the producer's work finished"
        assert ctypes.pythonapi.PyCapsule_IsValid(ctypes.py_object(result["capsule"]), b"dltensor")
    finally:
        producer.stdin.write("\n")
        producer.stdin.flush()
        producer.communicate(timeout=30)


def test_dlpack_takes_the_stream_positionally_as_some_jax_versions_pass_it(client, name):
    import ctypes

    t = client.empty((16,), "float32", device="cuda:0")
    n = name()
    client.publish(t, n, stream=1)
    got = client.get(n)
    waits = fake_driver().tensord_fake_cuda_stream_waits
    waits.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    before = waits(0x5151, -1, 0)
    got.__dlpack__(0x5151)  # positional, as jax.dlpack does in some versions
    got.__dlpack__(0x5151, (1, 0))  # stream and max_version, both positional
    assert waits(0x5151, -1, 0) == before + 2


def test_a_publish_with_stream_minus_one_records_no_ready_event(client, other, name):
    """A producer that has synchronized says so with stream=-1: no event is recorded, and a
    consumer (one that could not open this process's events, in another PID namespace) has
    nothing to wait for."""
    import ctypes

    calls = fake_driver().tensord_fake_cuda_calls
    calls.argtypes = [ctypes.c_char_p]
    t = client.empty((16,), "float32", device="cuda:0")
    n = name()
    records = calls(b"cuEventRecord")
    client.publish(t, n, stream=-1)
    assert calls(b"cuEventRecord") == records
    got = other.get(n)
    waits = fake_driver().tensord_fake_cuda_stream_waits
    waits.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    before = waits(0x6161, -1, 0)
    got.__dlpack__(stream=0x6161)
    assert waits(0x6161, -1, 0) == before
    with pytest.raises(ValueError, match="not -1"):
        client.put(name(), t, stream=-1)
