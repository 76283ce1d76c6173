"""take, watch, delete, list, stat, status; waits, timeouts, errors, threads, Ctrl-C."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tensord
from conftest import session_waiting, wait_for


def test_errors_carry_the_brokers_message(client):
    with pytest.raises(tensord.NotFound) as e:
        client.get("py/absent")
    assert isinstance(e.value, tensord.Error)
    assert e.value.code == "NOT_FOUND"
    assert "py/absent" in str(e.value) and e.value.message == str(e.value)
    for cls in (tensord.NotFound, tensord.Timeout, tensord.ResourceExhausted,
                tensord.PermissionDenied, tensord.InvalidArgument, tensord.Unavailable):
        assert issubclass(cls, tensord.Error) and cls.__module__ == "tensord"


def test_a_missing_name_suggests_a_bound_one_a_typo_away(client, name):
    n = name("weights")
    client.put(n, np.zeros(2, dtype=np.float32))
    typo = n.replace("weights", "wieghts")
    for call in (lambda: client.get(typo), lambda: client.take(typo), lambda: client.stat(typo),
                 lambda: client.delete(typo)):
        with pytest.raises(tensord.NotFound, match=f"did you mean '{n}'"):
            call()
    with pytest.raises(tensord.NotFound) as e:  # nothing near: no hint
        client.get(name("entirely-different-") + "-x")
    assert "did you mean" not in str(e.value)


def test_connect_without_a_broker_is_unavailable(tmp_path):
    with pytest.raises(tensord.Unavailable) as e:
        tensord.connect(str(tmp_path / "none.sock"))
    assert "none.sock" in str(e.value)


def test_resource_exhausted(client, name):
    with pytest.raises(tensord.ResourceExhausted):
        client.empty((1 << 50,), "uint8")


def test_timeout_semantics(client, name):
    n = name()
    # Timeout 0 looks once: the answer is NotFound, never the Timeout of a wait.
    with pytest.raises(tensord.NotFound):
        client.get(n)
    with pytest.raises(tensord.NotFound):
        client.take(n, timeout=0.0)
    start = time.monotonic()
    with pytest.raises(tensord.Timeout) as e:
        client.get(n, timeout=0.5)
    # It did not give up early (no upper bound: a loaded machine may answer late).
    assert time.monotonic() - start >= 0.45
    assert e.value.code == "DEADLINE_EXCEEDED"
    # One timeout, the caller's: not the broker's for the last of the short waits it was made of.
    assert e.value.message == f"'{n}' did not arrive within 0.5 s"
    with pytest.raises(tensord.Timeout):
        client.take(n + "/", timeout=0.2)


def test_timeout_and_not_found_are_the_builtin_exceptions_too(client, name):
    n = name()
    with pytest.raises(TimeoutError) as e:
        client.get(n, timeout=0.1)
    assert isinstance(e.value, tensord.Timeout) and e.value.code == "DEADLINE_EXCEEDED"
    assert str(e.value) == e.value.message == f"'{n}' did not arrive within 0.1 s"
    with pytest.raises(LookupError) as e:
        client.stat(n)
    assert isinstance(e.value, tensord.NotFound) and e.value.code == "NOT_FOUND"
    assert issubclass(tensord.Timeout, TimeoutError) and issubclass(tensord.NotFound, LookupError)
    assert not issubclass(tensord.InvalidArgument, (TimeoutError, LookupError))


@pytest.mark.parametrize("timeout", [None, 10.0])
def test_wait_until_published(client, other, name, timeout):
    n = name()
    timer = threading.Timer(0.4, lambda: other.put(n, np.arange(3)))
    timer.start()
    start = time.monotonic()
    t = client.get(n, timeout=timeout)
    assert time.monotonic() - start >= 0.3
    assert t.numpy().tolist() == [0, 1, 2]
    timer.join()


def test_min_generation(client, other, name):
    n = name()
    g = client.put(n, np.zeros(1))["generation"]
    assert client.get(n, min_generation=g).generation == g
    with pytest.raises(tensord.Timeout):
        client.get(n, timeout=0.3, min_generation=g + 1)
    timer = threading.Timer(0.3, lambda: other.put(n, np.ones(1)))
    timer.start()
    t = client.get(n, timeout=10, min_generation=g + 1)
    assert t.generation > g and t.numpy().tolist() == [1.0]
    timer.join()


def test_take_is_a_queue(client, other, name):
    prefix = name("q") + "/"
    for i in range(3):
        client.put(f"{prefix}{'cba'[i]}", np.full(1, i))
    taken = [other.take(prefix) for _ in range(3)]
    assert [t.numpy()[0] for t in taken] == [0, 1, 2], "oldest first, not by name"
    assert [t.name for t in taken] == [f"{prefix}c", f"{prefix}b", f"{prefix}a"]
    assert client.list(prefix) == []
    with pytest.raises(tensord.NotFound):
        client.get(f"{prefix}c")
    with pytest.raises(tensord.NotFound):
        client.take(prefix)
    n = name()
    client.put(n, np.arange(2))
    assert client.take(n).numpy().tolist() == [0, 1]
    with pytest.raises(tensord.NotFound):
        client.take(n)


def test_take_waits_for_a_producer(client, other, name):
    prefix = name("w") + "/"
    timer = threading.Timer(0.3, lambda: other.put(prefix + "x", np.arange(4)))
    timer.start()
    t = client.take(prefix, timeout=None)
    assert t.numpy().tolist() == [0, 1, 2, 3]
    timer.join()


def test_list_stat_delete_status(client, other, name):
    prefix = name("l") + "/"
    client.put(prefix + "a", np.zeros((2, 2), dtype=np.float32))
    client.put(prefix + "b", np.zeros(3, dtype=np.uint8))
    client.put(name("z"), np.zeros(1))
    listed = client.list(prefix)
    assert sorted(i["name"] for i in listed) == [prefix + "a", prefix + "b"]
    assert all(isinstance(i, dict) for i in listed)
    assert any(i["name"] == prefix + "a" for i in client.list())
    held = other.get(prefix + "a")
    other.flush()
    stat = client.stat(prefix + "a")
    assert stat["dtype"] == "float32" and stat["shape"] == (2, 2) and stat["nbytes"] == 16
    assert stat["state"] == "sealed" and stat["device"] == (1, 0)
    holders = [h for h in stat["holders"] if h["session_id"] == other.session_id]
    assert len(holders) == 1 and holders[0]["leases"] >= 1 and holders[0]["pid"] == os.getpid()
    assert client.stat(stat["tensor_id"])["tensor_id"] == stat["tensor_id"]
    assert client.get(stat["tensor_id"]).tensor_id == stat["tensor_id"]
    client.delete(prefix + "a")
    with pytest.raises(tensord.NotFound):
        client.get(prefix + "a")
    with pytest.raises(tensord.NotFound):
        client.delete(prefix + "a")
    assert held.numpy().tolist() == [[0, 0], [0, 0]], "holders keep valid data after delete"
    status = client.status()
    assert status["sessions"] >= 2 and status["named_tensors"] >= 2
    assert status["socket"] and status["version"]


def test_watch(client, other, name):
    prefix = name("watch") + "/"
    with client.watch(prefix) as w:
        other.put(prefix + "a", np.zeros(1))
        event = w.next(timeout=5)
        assert event["kind"] == "bound" and event["name"] == prefix + "a"
        assert event["tensor"]["dtype"] == "float64"
        other.put(name("elsewhere"), np.zeros(1))  # not under the prefix
        other.delete(prefix + "a")
        event = w.next(timeout=5)
        assert event["kind"] == "unbound" and event["name"] == prefix + "a"
        assert w.next(timeout=0.2) is None
    assert list(w) == []  # closed: iteration ends
    other.put(prefix + "b", np.zeros(1))
    with client.watch(prefix, initial=True) as w:
        assert next(iter(w))["name"] == prefix + "b"


def test_watch_iteration_from_another_thread(client, other, name):
    prefix = name("wt") + "/"
    w = client.watch(prefix)
    seen = []

    def consume():
        for event in w:
            seen.append(event["name"])
            if len(seen) == 3:
                break

    thread = threading.Thread(target=consume)
    thread.start()
    for i in range(3):
        other.put(f"{prefix}{i}", np.zeros(1))
    thread.join(10)
    assert not thread.is_alive()
    assert seen == [f"{prefix}{i}" for i in range(3)]
    w.close()


def test_threads_share_one_client(client, name):
    errors = []
    base = name("thr")

    def work(k):
        try:
            for i in range(20):
                n = f"{base}/{k}/{i}"
                client.put(n, np.full(16, k * 100 + i, dtype=np.int32))
                t = client.get(n)
                assert t.numpy()[0] == k * 100 + i
                t.release()
                client.delete(n)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert client.list(base + "/") == []


def test_waits_release_the_gil(client, name):
    n = name()
    waiter = threading.Thread(target=lambda: pytest.raises(tensord.Timeout, client.get, n, 1.0))
    waiter.start()
    count = 0
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        count += 1
    client.put(name(), np.zeros(1))  # the client is usable while another thread waits
    waiter.join()
    assert count > 100_000, "the main thread barely ran while another waited"


def test_ctrl_c_interrupts_a_wait(broker, other):
    code = (
        "import sys, tensord\n"
        "c = tensord.connect()\n"
        "print(c.session_id, flush=True)\n"
        "try:\n"
        "    c.get('py/never', timeout=None)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    sys.exit(3)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=broker.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"the child did not connect: {line!r}"
        session = int(line)
        # SIGINT while the get waits at the broker, not before it got there.
        wait_for(lambda: session_waiting(other, session) == 1, timeout=30,
                 what="the child's get to wait at the broker")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)  # only guards against a wait that ignores it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, err
    assert out.strip() == "interrupted"


def test_closed_client(broker):
    c = tensord.connect(broker.socket)
    assert c.session_id > 0 and c.socket == broker.socket
    with c:
        pass
    assert c.closed
    with pytest.raises(ValueError, match="closed"):
        c.get("py/x")
    c.close()  # idempotent


def test_lease_cache_lets_go(broker, other, name):
    n = name()
    other.put(n, np.arange(4.0))
    tensor_id = other.stat(n)["tensor_id"]

    def held_by(session):
        """The broker's count of the session's leases on the tensor (0 once it is freed)."""
        try:
            holders = other.stat(tensor_id)["holders"]
        except tensord.NotFound:
            return 0
        return sum(h["leases"] for h in holders if h["session_id"] == session.session_id)

    cached = tensord.connect(broker.socket, lease_cache=True, lease_cache_linger=0.3)
    a = cached.get(n).numpy()
    del a
    cached.flush()
    wait_for(lambda: held_by(cached) == 0, timeout=5, what="the cached lease to linger out")
    cached.close()

    # A linger far longer than the wait below: only the name's move can let the lease go.
    keeper = tensord.connect(broker.socket, lease_cache=True, lease_cache_linger=600)
    try:
        keeper.get(n).release()
        keeper.flush()
        assert held_by(keeper) == 1, "the cache keeps an idle lease while the name stays"
        b = keeper.get(n)
        other.delete(n)  # the name moved: the cached lease must not outlive the views
        values = b.numpy().tolist()  # the array's own reference goes with it
        assert values == [0.0, 1.0, 2.0, 3.0], "the view reads the data after the delete"
        assert held_by(keeper) == 1
        b.release()
        keeper.flush()
        wait_for(lambda: held_by(keeper) == 0, timeout=30,
                 what="the lease of the deleted name to go with its last view, not linger")
    finally:
        keeper.close()


def test_publish_without_waiting(client, other, name):
    n = name("nowait")
    t = client.empty((4,), "int32", ns="py")
    t.numpy()[:] = [1, 2, 3, 4]
    assert client.publish(t, n, wait=False) is None
    # The stream keeps order: this client's next call sees the publish.
    assert client.get(n).numpy().tolist() == [1, 2, 3, 4]
    client.flush()
    assert other.get(n).numpy().tolist() == [1, 2, 3, 4]

    # What the broker refuses comes with the next flush, naming each failed publish.
    clash = client.empty((1,), "int32", ns="py")
    client.publish(clash, n, if_absent=True, wait=False)
    elsewhere = client.empty((1,), "int32", ns="py")
    client.publish(elsewhere, "other/" + n, wait=False)
    with pytest.raises(tensord.Error) as e:
        client.flush()
    assert e.value.code == "ALREADY_EXISTS"
    assert "2 publishes sent without waiting failed" in str(e.value)
    assert repr(n) in str(e.value) and repr("other/" + n) in str(e.value)
    client.flush()  # reported once
    assert other.get(n).numpy().tolist() == [1, 2, 3, 4]

    # Local checks still fail at the call.
    t.release()
    with pytest.raises(ValueError):
        client.publish(t, n, wait=False)


def test_the_module_keeps_its_own_pybind11_internals():
    # Another extension's pybind11 (torch's) must never adopt ours: a release with the same
    # key would assume its own layout of our record (client/python/CMakeLists.txt).
    import builtins
    import ctypes

    # pybind11 2.x keeps the records in builtins (2.11 and later on Python 3.12: in the
    # interpreter's state dict); pybind11 3 in the state dict, keyed
    # __pybind11_internals_v<N><compiler type>_<stdlib>_<abi>__ alike.
    places = [vars(builtins)]
    unreadable = None
    try:
        get_interpreter = ctypes.pythonapi["PyInterpreterState_Get"]
        get_interpreter.restype, get_interpreter.argtypes = ctypes.c_void_p, []
        get_dict = ctypes.pythonapi["PyInterpreterState_GetDict"]
        # A borrowed reference: a py_object restype would take it as a new one and drop a
        # reference the interpreter owns, freeing its state dict, and pybind11's internals in
        # it, when `places` goes (the Python suite on the GPU image then crashed in a later
        # test's first numpy call). So the address, and a reference of our own from .value.
        get_dict.restype, get_dict.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
        state_dict = get_dict(get_interpreter())
        if not state_dict:
            raise ValueError("PyInterpreterState_GetDict returned NULL")
        places.append(ctypes.cast(state_dict, ctypes.py_object).value)
    except (AttributeError, ValueError) as e:  # no such symbol, or no state dict (NULL)
        unreadable = e
    keys = [k for place in places for k in place
            if isinstance(k, str) and k.startswith("__pybind11_internals_v")]
    if not keys and unreadable is not None:
        pytest.skip(f"no pybind11 internals in builtins, and the interpreter's state dict, where "
                    f"pybind11 3 keeps them, cannot be read here: {unreadable}")
    assert keys, "import tensord left no pybind11 internals in builtins or the state dict"
    assert any("_tensord_" in k for k in keys), f"tensord shares another key: {keys}"


def test_dtype_and_device_compare_equal_to_numpy_and_torch_spellings(client, name):
    import json

    import numpy as np
    import torch

    n = name()
    client.put(n, np.zeros((2, 2), dtype=np.float32))
    t = client.get(n)
    assert t.dtype == "float32" and isinstance(t.dtype, str) and json.dumps(t.dtype) == '"float32"'
    assert t.dtype == np.float32 and np.float32 == t.dtype and t.dtype == np.dtype("float32")
    assert t.dtype == torch.float32 and torch.float32 == t.dtype
    assert t.dtype != torch.int32 and t.dtype != np.int64 and t.dtype != 3
    assert t.dtype.numpy() is np.dtype("float32") or t.dtype.numpy() == np.dtype("float32")
    assert t.dtype.torch() is torch.float32
    assert {t.dtype: "x"}["float32"] == "x"  # hashes as its name

    assert t.device == (1, 0) and t.device == "cpu" and t.device == torch.device("cpu")
    assert torch.device("cpu") == t.device and t.device != "cuda:0" and t.device != torch.device("cuda", 0)
    assert str(t.device) == "cpu" and t.device.type == "cpu" and t.device.id == 0
    assert t.device == t.__dlpack_device__() and isinstance(t.device, tuple)
    with pytest.raises(TypeError, match="bfloat16"):
        tensord.DType("bfloat16").numpy()
    assert str(tensord.Device((2, 1))) == "cuda:1" and tensord.Device((2, 1)) == "cuda:1"
    assert str(tensord.Device((3, 0))) == "cuda_host"
    # The names come from the memory kinds' own descriptions, as tensorctl's do.
    assert str(tensord.Device((14, 1))) == "xpu:1" and tensord.Device((14, 1)).type == "xpu"
    assert str(tensord.Device((9, 2))) == "device9:2" and tensord.Device((9, 2)).type == "9"
    kinds = {k["device_prefix"]: k for k in tensord._tensord._memory_kinds()}
    assert kinds["cpu"]["host_readable"] and not kinds["cuda"]["host_readable"]
    assert not kinds["cuda_host"]["own_memory"]
    with pytest.raises(ValueError, match="give 'cpu', 'cuda', 'cuda:N', 'xpu', 'xpu:N'.*tuple"):
        tensord._client.device_tuple("cuda_host")  # a view is asked for (pinned=True), not named
    assert tensord.Device((1, 0)) != "cuda_host:0"


def test_status_counts_a_sessions_calls_waiting_for_a_name(client, other, name):
    """What a test (or an operator) reads to know a consumer is waiting, instead of sleeping."""
    n = name()

    def waiting():
        return session_waiting(client, other.session_id)

    assert waiting() == 0
    got = []
    taker = threading.Thread(target=lambda: got.append(other.take(n, timeout=30)))
    taker.start()
    try:
        wait_for(lambda: waiting() == 1, what="the take to wait in the broker")
        client.put(n, np.arange(4, dtype=np.int32))
    finally:
        taker.join(timeout=30)
    assert got and got[0].numpy().tolist() == [0, 1, 2, 3]
    assert waiting() == 0
