"""Level Zero (xpu) tensors from Python through the daemon, with Debian's real Level Zero
loader loading tests/fake_ze's software driver (ZE_ENABLE_ALT_DRIVERS): the plumbing
between processes, never an Intel GPU. Run by `ctest -L level-zero-fake`
(python_level_zero_fake_tests), which sets the loader's variables for this process, the
daemon and the children. Debian's torch has no xpu device, so the bytes are not read here;
tests/integration/level_zero/ reads them through command lists.
"""

import os
import subprocess
import sys

import pytest

import tensord

if not os.environ.get("ZE_ENABLE_ALT_DRIVERS", "").endswith("libtensord_fake_ze.so"):
    pytest.skip(
        "needs the software Level Zero driver: run `ctest -L level-zero-fake` (it sets ZE_ENABLE_ALT_DRIVERS)",
        allow_module_level=True,
    )

CONSUMER = """
import sys, tensord
c = tensord.connect(sys.argv[1])
t = c.get(sys.argv[2])
print(t.__dlpack_device__(), t.shape, t.dtype)
t.__dlpack__()            # no stream: the ready event is waited on the host
t.__dlpack__(stream=-1)   # no ordering asked
try:
    t.numpy()
except TypeError as e:
    print("numpy refused")
"""


def level_zero(client):
    return next(b for b in client.status()["backends"] if b["name"] == "level_zero")


def test_empty_on_an_xpu_is_named_by_uuid_and_read_by_another_process(broker, client, name):
    backend = level_zero(client)
    assert backend["available"], backend
    assert [d["device_id"] for d in backend["devices"]] == [0, 1]

    t = client.empty((4, 8), "float32", device="xpu:1")
    assert t.__dlpack_device__() == (14, 1)
    with pytest.raises(TypeError):
        t.numpy()
    n = name()
    client.publish(t, n)
    assert level_zero(client)["devices"][1]["bytes_in_use"] == 64 << 10

    out = subprocess.run([sys.executable, "-c", CONSUMER, broker.socket, n], env=broker.env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["(14, 1) (4, 8) float32", "numpy refused"], out.stdout


def test_device_names_and_errors(client):
    assert tensord._client.device_tuple("xpu") == (14, 0)
    assert tensord._client.device_tuple("xpu:1") == (14, 1)
    with pytest.raises(ValueError, match="'xpu:N'"):
        tensord._client.device_tuple("xpu:one")
    # The software driver has two devices: this process has no sixth.
    with pytest.raises(tensord.Error, match="level_zero device 5 does not exist here"):
        client.empty((4,), "float32", device="xpu:5")
