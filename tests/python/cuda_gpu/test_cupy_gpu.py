"""CuPy consumers of tensord CUDA tensors published by another process, on a real GPU:
cupy.from_dlpack over the tensor (no copy), the stream CuPy passes (its current one) made
to wait for the producer's ready event on the GPU (no host wait), on a stream of the
consumer's own and on CuPy's default stream.

CuPy does not honour DLPack's read-only flag (data-apis/array-api#191): an array over a
readonly=True view is writable to CuPy, and a write faults where the driver maps it
read-only. Treat such arrays as read-only yourself.

Skips, saying why, without CuPy with a GPU or a CUDA build of torch (the producer). Run on a
GPU machine by tests/gpu/run-on-gpu.sh; docs/gpu-runs/ keeps what each run printed.
"""


import pytest

import ordered_handoff

torch = ordered_handoff.gpu_torch(pytest)
ordered_handoff.importable(pytest, "CuPy", "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0")

CUPY_CONSUMER = '''
import sys, cupy, tensord
socket, name, n, shift = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
STREAM
expected = cupy.arange(n, dtype=cupy.float32) + shift
cupy.array_equal(expected, expected).get()  # kernels compiled before the wait
c = tensord.connect(socket, client_name="cupy-consumer")
t = c.get(name, timeout=120)
r = Recorder(t)
with stream:
    a = cupy.from_dlpack(r)
    print("imported", flush=True)
    same = cupy.array_equal(a, expected)
    print("values", bool(same.get()))
print("device", a.device)
print("stream", stream.ptr)
print("dlpack", r.calls)
'''


def check(lines):
    assert lines[0] == "imported"
    assert lines[1] == "values True", lines
    assert lines[2].startswith("device <CUDA Device 0>"), lines
    own_stream = int(lines[3].split()[1])
    calls = eval(lines[4][len("dlpack "):])  # noqa: S307  (our own repr of (args, kwargs) tuples)
    assert calls, "CuPy did not call __dlpack__"
    args, kwargs = calls[-1]
    stream = args[0] if args else kwargs.get("stream")
    print("cupy called __dlpack__ with", calls)
    return own_stream, stream


def test_cupy_reads_a_tensor_another_process_wrote_on_its_own_stream(broker, client, name):
    code = CUPY_CONSUMER.replace("STREAM", "stream = cupy.cuda.Stream(non_blocking=True)")
    own_stream, passed = check(ordered_handoff.run(torch, broker, client, name, code, "cupy-consumer"))
    assert passed == own_stream, f"CuPy passed stream {passed}, not its current one ({own_stream})"


def test_cupy_reads_a_tensor_another_process_wrote_on_its_default_stream(broker, client, name):
    code = CUPY_CONSUMER.replace("STREAM", "stream = cupy.cuda.Stream.null")
    own_stream, passed = check(ordered_handoff.run(torch, broker, client, name, code, "cupy-consumer"))
    # DLPack's numbers for the default streams: 1 legacy, 2 per-thread; 0 is ambiguous.
    assert passed in (1, 2), f"CuPy passed stream {passed} for its default stream"
