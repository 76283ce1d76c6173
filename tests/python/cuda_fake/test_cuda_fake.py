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
