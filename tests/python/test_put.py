"""put(): one copy of any array (DLPack, buffer protocol, array interface; any strides), and
empty() + publish() without a copy."""

import re
import sys

import numpy as np
import pytest
import torch

import tensord

ALL_NUMPY = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "float32", "float64", "complex64", "complex128"]


def roundtrip(client, name, obj):
    info = client.put(name, obj)
    t = client.get(name)
    assert info["name"] == name and info["tensor_id"] == t.tensor_id
    return info, t


@pytest.mark.parametrize("dtype", ALL_NUMPY)
def test_numpy_dtypes(client, name, dtype):
    a = (np.arange(24) % 3).astype(dtype).reshape(2, 3, 4)
    info, t = roundtrip(client, name(), a)
    assert info["dtype"] == dtype and info["shape"] == (2, 3, 4)
    assert info["strides"] == (12, 4, 1)
    np.testing.assert_array_equal(t.numpy(), a)


@pytest.mark.parametrize("view", [
    lambda a: a[:, ::2],
    lambda a: a.T,
    lambda a: a[::-1, ::-3],
    lambda a: a[1:, 1:3],
    lambda a: np.broadcast_to(a[:1], (4, 6)),
    lambda a: a.reshape(4, 3, 2).transpose(2, 0, 1)[:, ::2],
])
def test_numpy_views_any_strides(client, name, view):
    v = view(np.arange(24, dtype=np.float64).reshape(4, 6))
    info, t = roundtrip(client, name(), v)
    assert info["shape"] == v.shape
    np.testing.assert_array_equal(t.numpy(), v)
    assert t.numpy().flags.c_contiguous


def test_numpy_arrays_numpy_will_not_export_over_dlpack(client, name):
    # Read-only arrays and bool: numpy's __dlpack__ raises BufferError, the buffer
    # protocol takes them.
    ro = np.arange(5, dtype=np.int16)
    ro.flags.writeable = False
    with pytest.raises(BufferError):
        ro.__dlpack__()
    _, t = roundtrip(client, name(), ro)
    assert t.numpy().tolist() == [0, 1, 2, 3, 4]
    flags = np.array([[True, False, True], [False, False, True]])[:, ::2]
    _, t = roundtrip(client, name(), flags)
    assert t.dtype == "bool" and t.numpy().tolist() == [[True, True], [False, True]]


def test_scalar_and_empty_arrays(client, name):
    _, t = roundtrip(client, name(), np.array(3.5, dtype=np.float32))
    assert t.shape == () and t.numpy().item() == 3.5
    _, t = roundtrip(client, name(), np.zeros((3, 0), dtype=np.int8))
    assert t.shape == (3, 0) and t.nbytes == 0


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4),
    lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
    lambda: torch.arange(24, dtype=torch.int64).reshape(2, 3, 4)[:, ::2, 1:],
    lambda: torch.arange(12, dtype=torch.uint8).reshape(3, 4)[::2],
    lambda: torch.arange(6, dtype=torch.float32).requires_grad_(True),
    lambda: torch.arange(6, dtype=torch.float16).expand(2, 6),
])
def test_torch_tensors(client, name, make):
    x = make()
    info, t = roundtrip(client, name(), x)
    assert info["shape"] == tuple(x.shape)
    assert torch.equal(t.torch(), x.detach().contiguous())


def test_torch_bool_and_bfloat16(client, name):
    x = torch.tensor([[True, False, True], [False, True, True]]).t()
    info, t = roundtrip(client, name(), x)
    assert info["dtype"] == "bool"
    assert t.torch().tolist() == x.tolist()
    y = torch.tensor([0.5, 1.0, -3.0], dtype=torch.bfloat16)[::2]
    info, t = roundtrip(client, name(), y)
    assert info["dtype"] == "bfloat16" and t.torch().tolist() == [0.5, -3.0]


def test_bytes_and_memoryviews(client, name):
    _, t = roundtrip(client, name(), b"hello")
    assert t.dtype == "uint8" and bytes(t.numpy()) == b"hello"
    _, t = roundtrip(client, name(), memoryview(bytearray(range(10)))[::3])
    assert t.numpy().tolist() == [0, 3, 6, 9]
    _, t = roundtrip(client, name(), memoryview(np.arange(6, dtype=np.int32).reshape(2, 3)))
    assert t.shape == (2, 3) and t.dtype == "int32"


class ArrayInterfaceOnly:
    """Exposes only numpy's array interface (no __dlpack__, no buffer protocol)."""

    def __init__(self, array):
        self._array = array
        self.__array_interface__ = array.__array_interface__


def test_array_interface(client, name):
    a = np.arange(20, dtype=np.uint16).reshape(4, 5)[::2, 1:]
    _, t = roundtrip(client, name(), ArrayInterfaceOnly(a))
    assert t.dtype == "uint16"
    np.testing.assert_array_equal(t.numpy(), a)


class VersionedProducer:
    """Accepts max_version and records what it was asked for."""

    def __init__(self, array):
        self.array = array
        self.calls = []

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append(max_version)
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return (1, 0)


class LegacyProducer:
    """A producer from before DLPack 1.0: no max_version argument."""

    def __init__(self, array):
        self.array = array
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self.array.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return (1, 0)


class RefusingProducer:
    """Takes max_version but refuses it with a TypeError that does not name it."""

    def __init__(self, array):
        self.array = array
        self.asked = []

    def __dlpack__(self, stream=None, **kwargs):
        self.asked.append(sorted(kwargs))
        if kwargs:
            raise TypeError("versioned capsules are not supported here")
        return self.array.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return (1, 0)


def test_a_producer_that_refuses_max_version_is_not_offered_it_again(client, name):
    """Whatever its TypeError says: put() does not read error text."""
    a = np.arange(3, dtype=np.int32)
    first = RefusingProducer(a)
    _, t = roundtrip(client, name(), first)
    assert first.asked == [["max_version"], []] and t.numpy().tolist() == a.tolist()
    second = RefusingProducer(a)
    _, t = roundtrip(client, name(), second)
    assert second.asked == [[]] and t.numpy().tolist() == a.tolist()


def test_dlpack_producers_with_and_without_max_version(client, name):
    a = np.arange(6, dtype=np.float32)
    new = VersionedProducer(a)
    _, t = roundtrip(client, name(), new)
    assert new.calls == [(1, 0)] and t.numpy().tolist() == a.tolist()
    old = LegacyProducer(a)
    _, t = roundtrip(client, name(), old)
    assert old.calls == 1 and t.numpy().tolist() == a.tolist()


def test_put_of_a_tensord_tensor_uses_a_versioned_capsule(client, name):
    first = name()
    client.put(first, np.arange(4, dtype=np.int64))
    src = client.get(first, readonly=True)  # legacy export is refused: only versioned works
    _, t = roundtrip(client, name(), src)
    assert t.numpy().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("obj", [[1, 2, 3], (1.5, 2.5), [[True, False], [False, True]], 7, 2.5,
                                 True, 1 + 2j, []])
def test_put_reads_what_numpy_asarray_reads(client, name, obj):
    info, t = roundtrip(client, name(), obj)
    expected = np.asarray(obj)
    assert t.dtype == expected.dtype.name and tuple(info["shape"]) == expected.shape
    assert t.numpy().tolist() == expected.tolist()


def test_put_many_reads_lists(client, name):
    a, b = name(), name()
    client.put_many({a: [1, 2], b: (3.0,)})
    assert client.get(a).numpy().tolist() == [1, 2] and client.get(b).numpy().tolist() == [3.0]


def test_put_says_what_to_pass(client, name, monkeypatch):
    with pytest.raises(TypeError, match="numpy reads this list as an array of Python objects"):
        client.put(name(), [object()])
    with pytest.raises(TypeError, match="numpy cannot make an array of this list"):
        client.put(name(), [[1, 2], [3]])
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy raises ImportError
    with pytest.raises(TypeError) as e:
        client.put(name(), [1, 2, 3])
    assert str(e.value) == (
        "put: cannot read a list without numpy to convert it: pass an object with __dlpack__, "
        "the buffer protocol or __array_interface__ (a numpy array or a torch tensor, for example)")


def test_put_refuses_what_it_cannot_read(client, name):
    with pytest.raises(TypeError):
        client.put(name(), np.array(["a", "b"]))
    with pytest.raises(TypeError, match="big-endian"):
        client.put(name(), np.arange(3, dtype=">f4"))
    with pytest.raises(tensord.InvalidArgument) as e:
        client.put("py//bad", np.zeros(2))
    assert e.value.code == "INVALID_ARGUMENT" and e.value.message


def test_empty_then_publish_without_a_copy(client, other, name):
    n = name()
    t = client.empty((2, 3), "float32")
    assert t.writable and t.shape == (2, 3) and t.dtype == "float32" and t.name is None
    # numpy 1.24 marks arrays it imports over DLPack read-only; numpy 2 (a versioned capsule,
    # not flagged read-only) writes in place. t.numpy() and torch write in both.
    imported = np.from_dlpack(t)
    if imported.flags.writeable:
        imported[...] = 3
        assert t.numpy().tolist() == [[3.0] * 3] * 2
    a = t.numpy()
    a[...] = 7
    x = torch.from_dlpack(t)
    x += 1
    assert x.data_ptr() == a.__array_interface__["data"][0]
    info = client.publish(t, n)
    assert t.name == n and t.generation == info["generation"]
    before = info["buffer_id"]
    got = other.get(n)
    assert got.numpy().tolist() == [[8.0] * 3] * 2
    assert other.stat(n)["buffer_id"] == before  # published in place: no second buffer


@pytest.mark.parametrize("dtype", ["uint16", np.uint16, np.dtype("uint16"), torch.int16,
                                   "bool", torch.bool, np.bool_])
def test_empty_dtype_spellings(client, dtype):
    t = client.empty(4, dtype)
    assert t.dtype == tensord.dtype_name(dtype) and t.shape == (4,)


@pytest.mark.parametrize("spelling,expected", [("f4", "float32"), ("<f4", "float32"),
                                               ("float", "float64"), ("single", "float32"),
                                               ("i8", "int64"), ("?", "bool"), ("c8", "complex64"),
                                               ("bfloat16", "bfloat16")])
def test_empty_takes_every_spelling_numpy_takes(client, spelling, expected):
    assert client.empty((2,), spelling).dtype == expected


@pytest.mark.parametrize("spelling,says", [("f5", "unknown dtype 'f5': give one of bool, int8"),
                                           (">f4", "not in this machine's byte order"),
                                           ("U4", "has no tensord counterpart: give one of bool")])
def test_empty_refuses_a_dtype_naming_the_valid_ones(client, spelling, says):
    if sys.byteorder != "little" and spelling == ">f4":
        spelling = "<f4"
    with pytest.raises(tensord.InvalidArgument, match=re.escape(says)):
        client.empty((2,), spelling)


def test_empty_in_a_namespace_publishes_only_there(client, name):
    t = client.empty([8], "int32", ns="py")
    t.numpy()[:] = np.arange(8)
    n = name()
    client.publish(t, n)
    assert client.get(n).numpy().tolist() == list(range(8))
    u = client.empty([8], "int32", ns="py")
    with pytest.raises(tensord.Error):
        client.publish(u, "elsewhere/x")


def test_publish_takes_only_empty_tensors(client, name):
    n = name()
    client.put(n, np.zeros(3))
    with pytest.raises(ValueError, match="empty"):
        client.publish(client.get(n), name())
    with pytest.raises(TypeError):
        client.publish(np.zeros(3), name())
    with pytest.raises(tensord.InvalidArgument):
        client.empty((2,), "float128")


def test_conditional_publish(client, name):
    n = name()
    g1 = client.put(n, np.zeros(2), if_absent=True)["generation"]
    with pytest.raises(tensord.Error) as e:
        client.put(n, np.ones(2), if_absent=True)
    assert e.value.code in ("ALREADY_EXISTS", "FAILED_PRECONDITION", "ABORTED")
    g2 = client.put(n, np.ones(2), if_generation=g1)["generation"]
    assert g2 > g1
    with pytest.raises(tensord.Error):
        client.put(n, np.full(2, 5.0), if_generation=g1)
    assert client.get(n).numpy().tolist() == [1.0, 1.0]
    with pytest.raises(ValueError):
        client.put(n, np.ones(2), if_absent=True, if_generation=g2)


def test_ttl_unbinds(client, name):
    n = name()
    client.put(n, np.zeros(2), ttl=0.2)
    assert client.get(n).shape == (2,)
    import time

    deadline = time.monotonic() + 5
    while True:
        try:
            client.get(n).release()
        except tensord.NotFound:
            break
        assert time.monotonic() < deadline, "ttl did not unbind the name"
        time.sleep(0.05)


def test_put_many_get_many(client, name):
    names = [name("m") for _ in range(4)]
    infos = client.put_many({n: np.full(3, i, dtype=np.int32) for i, n in enumerate(names)})
    assert [i["name"] for i in infos] == names
    infos = client.put_many([(n, np.full(2, 9)) for n in names[:2]])
    assert [i["generation"] for i in infos] == [2, 2] or all(i["generation"] > 1 for i in infos)
    got = client.get_many(names)
    assert [g.numpy().tolist() for g in got] == [[9, 9], [9, 9], [2, 2, 2], [3, 3, 3]]
    with pytest.raises(tensord.NotFound):
        client.get_many(names + ["py/absent"])
    with pytest.raises(tensord.Timeout):
        client.get_many(["py/absent"], timeout=0.2)


def test_tags_from_empty_publish_put_and_put_many(client, name):
    t = client.empty((2,), "float32", ns="py", tags={"source": "camera-3"})
    n = name()
    info = client.publish(t, n, tags={"epoch": "7"})
    assert info["tags"] == {"source": "camera-3", "epoch": "7"}
    assert client.stat(n)["tags"] == {"source": "camera-3", "epoch": "7"}

    t = client.empty((2,), "float32", tags={"source": "a", "kept": "yes"})
    client.publish(t, name(), wait=False, tags={"source": "b"})  # a key given again is replaced
    client.flush()
    assert client.list("py/")[-1]["tags"] == {"source": "b", "kept": "yes"}

    m = name()
    assert client.put(m, np.zeros(3), tags={"k": "v"})["tags"] == {"k": "v"}
    many = client.put_many({name(): np.ones(2), name(): np.ones(4)}, tags={"batch": "12"})
    assert [i["tags"] for i in many] == [{"batch": "12"}] * 2

    with pytest.raises(TypeError, match="a dict of str to str"):
        client.put(name(), np.zeros(1), tags={"k": 1})
    with pytest.raises(tensord.InvalidArgument, match="tags: keys 1.."):
        client.put(name(), np.zeros(1), tags={"": "empty key"})
    too_many = {f"k{i}": "v" for i in range(1000)}
    with pytest.raises(tensord.InvalidArgument, match="tags"):
        client.publish(client.empty((1,), "uint8"), name(), tags=too_many)
