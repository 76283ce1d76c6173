"""The producer's half of the GPU stream-order tests (torch, JAX and CuPy consumers:
test_cuda_gpu.py, test_jax_gpu.py, test_cupy_gpu.py), and the skips they share: torch in
this process writes a tensord CUDA tensor
behind about 2 s of queued GPU work and publishes it with its stream; the consumer, a
framework in another process, reads it at once. Stream order holds when the consumer sees
the written values although the producer's work was still pending when the consumer's
from_dlpack returned (no host wait there), which this module checks, not assumes."""

import os
import subprocess
import sys
import time

ELEMENTS = 1 << 22  # 16 MiB of float32
SLEEP_CYCLES = 4_000_000_000  # about 2 s of GPU time (H100/H200 clocks) queued ahead of a write
SHIFT = 7.0

# Wraps a tensord tensor and records how the consumer calls __dlpack__ (positional or
# keyword arguments, the stream it passes), printed as "dlpack <args> <kwargs>".
RECORDER = '''
class Recorder:
    def __init__(self, t):
        self.t, self.calls = t, []
    def __dlpack_device__(self):
        return self.t.__dlpack_device__()
    def __dlpack__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.t.__dlpack__(*args, **kwargs)
'''


def gpu_torch(pytest):
    """torch with a CUDA GPU, or a module-level skip saying what is missing (no torch, the
    CUDA stand-in named by TENSORD_LIBCUDA, no GPU)."""
    torch = pytest.importorskip("torch", reason="needs torch (a CUDA build) and a GPU")
    if os.environ.get("TENSORD_LIBCUDA"):
        pytest.skip(f"TENSORD_LIBCUDA={os.environ['TENSORD_LIBCUDA']} names a stand-in: these tests are "
                    "for a real GPU", allow_module_level=True)
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False): "
                    "these tests need one", allow_module_level=True)
    return torch


def importable(pytest, what, probe, env=None):
    """Skips the module unless `probe` (Python code) runs in a fresh interpreter: a framework
    with its GPU (JAX, CuPy) is checked without loading it into the test process."""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, **(env or {})))
    if out.returncode != 0:
        pytest.skip(f"{what} with a GPU is not importable here: " +
                    (out.stderr.strip().splitlines() or ["?"])[-1], allow_module_level=True)


def waiting_sessions(client, client_name):
    return sum(u["waiting"] for u in client.status(sessions=True)["session_usage"]
               if u["client_name"] == client_name)


def run(torch, broker, client, name, consumer_code, client_name, env=None):
    """Starts `consumer_code` (argv: socket, name, ELEMENTS, SHIFT), waits until the broker
    says its session waits for the name, publishes the ordered tensor, checks that the
    producer's work was still pending after the publish and again once the consumer printed
    its "imported" line, and returns the consumer's stdout lines."""
    t = client.empty((ELEMENTS,), "float32", device="cuda:0")
    x = torch.from_dlpack(t)
    values = torch.arange(ELEMENTS, device="cuda:0", dtype=torch.float32)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # once, so that no kernel loads lazily below while the sleep runs
        torch.cuda._sleep(1000)
        x.copy_(values + SHIFT)
    s.synchronize()
    x.zero_()  # what a consumer that does not wait would read
    torch.cuda.synchronize()
    n = name()
    consumer = subprocess.Popen([sys.executable, "-c", RECORDER + consumer_code, broker.socket, n, str(ELEMENTS),
                                 str(SHIFT)], env=env or broker.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while waiting_sessions(client, client_name) == 0:
            assert consumer.poll() is None, consumer.communicate()[1]
            assert time.monotonic() < deadline, "the consumer never waited for the name"
            time.sleep(0.05)
        with torch.cuda.stream(s):
            torch.cuda._sleep(SLEEP_CYCLES)
            x.copy_(values + SHIFT)
        client.publish(t, n, stream=s.cuda_stream)
        assert not s.query(), "the queued work finished before the publish: the test shows nothing"
        line = consumer.stdout.readline()
        assert line.startswith("imported"), line + consumer.communicate()[1]
        assert not s.query(), ("the producer's work finished before the consumer's from_dlpack returned: "
                               "the test shows nothing")
        out, err = consumer.communicate(timeout=180)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    assert consumer.returncode == 0, err
    s.synchronize()
    return [line.strip()] + out.splitlines()
