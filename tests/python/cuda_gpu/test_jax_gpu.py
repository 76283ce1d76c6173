"""JAX consumers of tensord CUDA tensors published by another process, on a real GPU:
jax.dlpack.from_dlpack over the tensor (no copy), with the stream JAX passes made to wait
for the producer's ready event on the GPU (no host wait), the lease held for as long as the
JAX array lives, and read-only views.

What a JAX consumer may rely on: a JAX array is immutable, and tensord keeps the memory of a
tensor it holds a lease on unchanged by the broker (its buffer is recycled only after every
lease is gone). A view of device memory is a shared writable mapping, so another consumer's
in-place write, or the producer writing after its publish, would show. A readonly=True view
would be mapped read-only where the driver allows, but JAX 0.11 asks for an unversioned
capsule, which cannot say read-only, and tensord refuses it (the last test records what this
JAX does).

Skips, saying why, without JAX with a GPU or a CUDA build of torch (the producer). Run on a
GPU machine by tests/gpu/run-on-gpu.sh; docs/gpu-runs/ keeps what each run printed.
"""

import subprocess
import sys

import pytest

import ordered_handoff

torch = ordered_handoff.gpu_torch(pytest)
JAX_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # JAX takes 75% of the GPU otherwise
ordered_handoff.importable(pytest, "JAX", "import jax; jax.devices('gpu')[0]", JAX_ENV)

JAX_CONSUMER = '''
import sys, jax, jax.numpy as jnp, tensord
socket, name, n, shift = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
expected = jnp.arange(n, dtype=jnp.float32) + shift
jnp.array_equal(expected, expected).block_until_ready()  # compiled before the wait
c = tensord.connect(socket, client_name="jax-consumer")
t = c.get(name, timeout=120)
r = Recorder(t)
a = jax.dlpack.from_dlpack(r)
print("imported", flush=True)
ok = bool(jnp.array_equal(a, expected))
print("values", ok)
print("device", a.devices())
print("dlpack", r.calls)
'''


def jax_env(broker):
    return dict(broker.env(), **JAX_ENV)


def test_jax_reads_a_tensor_another_process_wrote_in_stream_order(broker, client, name):
    lines = ordered_handoff.run(torch, broker, client, name, JAX_CONSUMER, "jax-consumer", env=jax_env(broker))
    assert lines[0] == "imported"
    assert lines[1] == "values True", lines
    assert "cuda" in lines[2].lower() or "gpu" in lines[2].lower(), lines
    # JAX passed a stream to wait on: tensord ordered it on the producer's ready event.
    calls = eval(lines[3][len("dlpack "):])  # noqa: S307  (our own repr of (args, kwargs) tuples)
    assert calls, "JAX did not call __dlpack__"
    args, kwargs = calls[-1]
    stream = args[0] if args else kwargs.get("stream")
    assert isinstance(stream, int) and stream not in (-1, 0), f"JAX passed no stream to order: {calls}"
    print("jax called __dlpack__ with", calls)


LEASE_CONSUMER = '''
import gc, sys, jax, jax.numpy as jnp, numpy as np, tensord
socket, name = sys.argv[1], sys.argv[2]
c = tensord.connect(socket, lease_cache=False)
t = c.get(name, timeout=30)
a = jax.dlpack.from_dlpack(t)
t.release()
del t
gc.collect()
c.flush()
print("holders while the array lives", len(c.stat(name)["holders"]))
print("sum", float(jnp.sum(a)))
del a
gc.collect()
c.flush()
import time
for _ in range(200):
    if len(c.stat(name)["holders"]) <= BASE:
        break
    time.sleep(0.05)
print("holders after", len(c.stat(name)["holders"]))
'''


def test_a_jax_array_holds_the_lease_until_it_is_gone(broker, client, name):
    n = name()
    client.put(n, torch.ones(1 << 20, device="cuda:0"))
    client.flush()
    base = len(client.stat(n)["holders"])  # the producer's, if it still holds one
    out = subprocess.run([sys.executable, "-c", LEASE_CONSUMER.replace("BASE", str(base)), broker.socket, n],
                         env=jax_env(broker), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"holders while the array lives {base + 1}", f"sum {float(1 << 20)}",
                                       f"holders after {base}"], out.stdout + out.stderr


READONLY_CONSUMER = '''
import sys, jax, jax.numpy as jnp, tensord
c = tensord.connect(sys.argv[1])
t = c.get(sys.argv[2], timeout=30, readonly=True)
try:
    a = jax.dlpack.from_dlpack(t)
except Exception as e:  # what this JAX does with a versioned capsule flagged read-only
    print("refused", type(e).__name__, str(e).splitlines()[0][:200])
else:
    print("sum", float(jnp.sum(a)))
'''


def test_a_read_only_view_is_taken_by_jax_or_refused_saying_why(broker, client, name):
    """JAX arrays are immutable, so a read-only view suits them; whether this JAX accepts a
    capsule flagged read-only is its own rule: the test records which, and fails on anything
    else (a crash, wrong values)."""
    n = name()
    client.put(n, torch.full((1 << 16,), 2.0, device="cuda:0"))
    out = subprocess.run([sys.executable, "-c", READONLY_CONSUMER, broker.socket, n], env=jax_env(broker),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    print("jax with a read-only view:", line)
    assert line == f"sum {2.0 * (1 << 16)}" or (line.startswith("refused") and "read" in line.lower()), line
