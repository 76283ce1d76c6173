"""DLPack export: capsule kinds and names, ownership, zero copy, and what consumers refuse.
Debian's torch 1.13 and numpy 1.24 refuse more than torch 2.x and numpy 2 from pip: each such
test asks the consumer what it reads and demands that of tensord's export, the refusal or the
right values, with the workaround next to it, so the suite holds for both."""

import ctypes
import gc

import numpy as np
import pytest
import torch

import tensord
from conftest import leases, wait_for

_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_name(capsule):
    return _get_name(capsule).decode()


def versioned_flags(capsule):
    """DLManagedTensorVersioned.flags (offset 24) of an unconsumed versioned capsule."""
    address = _get_pointer(capsule, b"dltensor_versioned")
    return ctypes.c_uint64.from_address(address + 24).value


def versioned_version(capsule):
    address = _get_pointer(capsule, b"dltensor_versioned")
    return (ctypes.c_uint32.from_address(address).value,
            ctypes.c_uint32.from_address(address + 4).value)


def data_ptr(array):
    return array.__array_interface__["data"][0]


@pytest.fixture
def floats(client, name):
    n = name("f")
    client.put(n, np.arange(12, dtype=np.float32).reshape(3, 4))
    client.flush()
    return n


def test_capsule_kind_follows_max_version(client, floats):
    t = client.get(floats)
    assert capsule_name(t.__dlpack__()) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=None)) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
    versioned = t.__dlpack__(max_version=(1, 0))
    assert capsule_name(versioned) == "dltensor_versioned"
    assert versioned_version(versioned) == (1, 0)
    assert capsule_name(t.__dlpack__(max_version=(1, 3))) == "dltensor_versioned"
    assert t.__dlpack_device__() == (1, 0)


def test_consumer_renames_the_capsule(client, floats):
    t = client.get(floats)
    capsule = t.__dlpack__()
    x = torch.utils.dlpack.from_dlpack(capsule)
    assert capsule_name(capsule) == "used_dltensor"
    assert x.tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()
    # The tensor owns the view now: the capsule's death changes nothing.
    del capsule
    gc.collect()
    assert x.sum().item() == 66.0


def test_unconsumed_capsules_free_their_references(client, other, floats):
    t = client.get(floats)
    capsules = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0))]
    t.release()
    client.flush()
    assert leases(other, floats) >= 1, "capsules hold the lease after the handle is released"
    del capsules
    gc.collect()
    client.flush()
    wait_for(lambda: leases(other, floats) == 0, what="the lease to go with the capsules")


def test_copy_true_and_other_devices_are_refused(client, floats):
    t = client.get(floats)
    with pytest.raises(BufferError, match="copy=True"):
        t.__dlpack__(copy=True)
    assert capsule_name(t.__dlpack__(copy=False)) == "dltensor"
    with pytest.raises(BufferError, match="device"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="device"):
        t.__dlpack__(max_version=(1, 0), dl_device=(1, 1))
    assert capsule_name(t.__dlpack__(dl_device=(1, 0))) == "dltensor"


def test_released_handle_refuses_new_views_but_keeps_its_description(client, floats):
    t = client.get(floats)
    t.release()
    t.release()  # idempotent
    assert t.released
    assert t.shape == (3, 4) and t.dtype == "float32" and t.name == floats
    with pytest.raises(ValueError, match="released"):
        t.__dlpack__()
    with pytest.raises(ValueError, match="released"):
        t.numpy()


def test_torch_and_numpy_from_dlpack_share_pages(client, floats):
    a = client.get(floats)
    b = client.get(floats)
    na = np.from_dlpack(a)
    nb = np.from_dlpack(b)
    ta = torch.from_dlpack(a)
    tb = torch.from_dlpack(b)
    assert data_ptr(na) == data_ptr(nb) == ta.data_ptr() == tb.data_ptr() == a._data_ptr
    assert data_ptr(a.numpy()) == data_ptr(na)
    assert b.torch().data_ptr() == ta.data_ptr()
    assert np.shares_memory(na, nb)
    assert na.tolist() == tb.tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()


def test_consumer_writes_stay_private_to_the_process(client, broker, floats):
    from conftest import run_python

    t = client.get(floats)
    x = t.torch()
    x += 100  # copy-on-write pages: this process only
    assert client.get(floats).numpy()[0, 0] == 100.0  # same mapping in this process
    code = (
        "import tensord; c = tensord.connect(); "
        f"print(c.get({floats!r}).numpy()[0, 0])"
    )
    result = run_python(code, broker.env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0.0"


# What a consumer refuses depends on its release: numpy 1.24 and torch 1.13 here, numpy 2 and
# torch 2.x from pip elsewhere. Each test first asks the consumer what it reads, with objects
# that are not tensord's (its own exports or numpy's), then demands exactly that of tensord's
# export: the old release's refusal where it refuses, the right values (zero-copy, read-only
# kept read-only) where it reads.


def reads(consume):
    """Whether consume() succeeds: numpy's and torch's from_dlpack refuse with RuntimeError
    or BufferError (older releases the one, newer the other)."""
    try:
        consume()
    except (RuntimeError, BufferError):
        return False
    return True


class _Recorder:
    """An exporter that records the keyword arguments a consumer passes to __dlpack__."""

    def __init__(self):
        self.kwargs = None
        self._array = np.zeros(1)

    def __dlpack__(self, **kwargs):
        self.kwargs = kwargs
        return self._array.__dlpack__()  # a legacy capsule, which every release reads

    def __dlpack_device__(self):
        return (1, 0)


def numpy_asks_for_versioned_capsules():
    """numpy 2.1 and later pass max_version=(1, 0), so tensord answers with a versioned
    capsule, which can say read-only; numpy 1.24 passes nothing and gets a legacy one."""
    recorder = _Recorder()
    np.from_dlpack(recorder)
    return (recorder.kwargs.get("max_version") or (0, 0))[0] >= 1


def read_or_refused(consumer_reads, read, refusal, check):
    """read() as the consumer's release does it: where consumer_reads, it succeeds and
    check(result) must hold; elsewhere it fails with `refusal`, a (types, pattern) pair."""
    if consumer_reads:
        check(read())
    else:
        types, pattern = refusal
        with pytest.raises(types, match=pattern):
            read()


def test_numpy_bool_over_dlpack_as_its_release_reads_it_numpy_method_works(client, name):
    n = name("bool")
    client.put(n, np.array([True, False, True]))
    t = client.get(n)
    assert t.dtype == "bool"

    def bools(a):
        assert a.dtype == np.bool_ and a.tolist() == [True, False, True]
        assert data_ptr(a) == t._data_ptr

    # numpy 1.25 and later read kDLBool (and export it: their own round trip says which).
    numpy_reads_bool = reads(lambda: np.from_dlpack(np.array([True])))
    read_or_refused(numpy_reads_bool, lambda: np.from_dlpack(t),
                    ((RuntimeError, BufferError), "Unsupported dtype"), bools)
    bools(t.numpy())
    assert np.asarray(t).tolist() == [True, False, True]


def test_torch_bool_over_dlpack_as_its_release_reads_it_torch_method_works(client, name):
    n = name("bool")
    client.put(n, torch.tensor([[True, False], [False, True]]))
    t = client.get(n)

    def bools(x):
        assert x.dtype == torch.bool and x.tolist() == [[True, False], [False, True]]
        assert x.data_ptr() == t._data_ptr

    # torch 1.13 neither reads nor exports kDLBool; releases that do, do both.
    torch_reads_bool = reads(lambda: torch.from_dlpack(torch.tensor([True])))
    read_or_refused(torch_reads_bool, lambda: torch.from_dlpack(t),
                    ((RuntimeError, BufferError), "Unsupported code 6"), bools)
    bools(t.torch())
    # Where torch will not export bool, put() copies its bytes.
    m = name("bool")
    client.put(m, torch.tensor([True, False]))
    assert client.get(m).torch().tolist() == [True, False]


@pytest.mark.parametrize("dtype,signed", [("uint16", torch.int16), ("uint32", torch.int32),
                                          ("uint64", torch.int64)])
def test_torch_wide_unsigned_as_its_release_reads_it(client, name, dtype, signed):
    n = name(dtype)
    values = np.array([1, np.iinfo(dtype).max], dtype=dtype)
    client.put(n, values)
    t = client.get(n)

    def unsigned(x):
        assert x.dtype == getattr(torch, dtype) and x.data_ptr() == t._data_ptr
        assert x[0].item() == 1

    # torch 2.3 and later have uint16/32/64; asked with numpy's export of the same dtype.
    torch_reads = reads(lambda: torch.from_dlpack(np.zeros(1, dtype=dtype)))
    read_or_refused(torch_reads, lambda: torch.from_dlpack(t),
                    ((RuntimeError, BufferError), "Unsupported kUInt bits"), unsigned)
    if torch_reads:
        unsigned(t.torch())
        unsigned(t.torch(reinterpret_unsigned=True))  # nothing to reinterpret where torch has them
    else:
        with pytest.raises(TypeError, match=f"no {dtype} tensors"):
            t.torch()
        x = t.torch(reinterpret_unsigned=True)  # asked for explicitly: the same bits, signed
        assert x.dtype == signed and x.tolist() == [1, -1]
        assert x.data_ptr() == t._data_ptr
    # numpy takes them over DLPack.
    assert np.from_dlpack(t).tolist() == values.tolist()
    assert t.numpy().dtype == np.dtype(dtype)


def test_bfloat16_works_in_torch_not_in_numpy(client, name):
    n = name("bf16")
    client.put(n, torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    t = client.get(n)
    assert t.dtype == "bfloat16"
    assert torch.from_dlpack(t).tolist() == [1.5, -2.0]
    assert t.torch().dtype == torch.bfloat16

    def bfloat16s(a):  # a numpy that reads kDLBfloat has a dtype registered for it
        assert a.dtype.name == "bfloat16" and a.astype(np.float32).tolist() == [1.5, -2.0]
        assert data_ptr(a) == t._data_ptr

    # numpy has no bfloat16 of its own; asked with torch's export of one.
    numpy_reads = reads(lambda: np.from_dlpack(torch.tensor([1.5], dtype=torch.bfloat16)))
    read_or_refused(numpy_reads, lambda: np.from_dlpack(t),
                    ((RuntimeError, BufferError), "Unsupported dtype"), bfloat16s)
    with pytest.raises(TypeError, match="numpy has no bfloat16"):
        t.numpy()


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "float16",
                                   "float32", "float64", "complex64", "complex128"])
def test_dtypes_both_frameworks_take_over_dlpack(client, name, dtype):
    n = name(dtype)
    values = (np.arange(6) % 5).astype(dtype).reshape(2, 3)
    client.put(n, values)
    t = client.get(n)
    assert t.dtype == dtype and t.shape == (2, 3) and t.nbytes == values.nbytes
    np.testing.assert_array_equal(np.from_dlpack(t), values)
    np.testing.assert_array_equal(torch.from_dlpack(t).numpy(), values)
    np.testing.assert_array_equal(t.numpy(), values)


def test_readonly_get(client, name):
    n = name("ro")
    client.put(n, np.arange(4, dtype=np.int32))
    t = client.get(n, readonly=True)
    assert t.readonly
    # A legacy capsule cannot say read-only, so it is refused, as numpy itself does.
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()

    def read_only(a):  # never a writable view of read-only memory
        assert not a.flags.writeable, "numpy got a writable array over a read-only mapping"
        assert a.tolist() == [0, 1, 2, 3] and data_ptr(a) == t._data_ptr

    # A numpy that asks for a versioned capsule gets one flagged read-only; one that asks
    # for a legacy capsule is refused.
    read_or_refused(numpy_asks_for_versioned_capsules(), lambda: np.from_dlpack(t),
                    (BufferError, "read-only"), read_only)
    capsule = t.__dlpack__(max_version=(1, 0))
    assert versioned_flags(capsule) & 1, "kDLFlagBitMaskReadOnly"
    array = t.numpy()
    assert not array.flags.writeable and array.tolist() == [0, 1, 2, 3]
    with pytest.warns(UserWarning, match="read-only"):
        x = t.torch()
    assert x.tolist() == [0, 1, 2, 3]
    writable = client.get(n)
    assert not writable.readonly
    assert versioned_flags(writable.__dlpack__(max_version=(1, 0))) & 1 == 0


def test_zero_byte_tensor(client, name):
    n = name("empty")
    client.put(n, np.zeros((0, 3), dtype=np.float32))
    t = client.get(n)
    assert t.shape == (0, 3) and t.nbytes == 0
    assert np.from_dlpack(t).shape == (0, 3)
    assert t.torch().shape == (0, 3)
    assert t.numpy().shape == (0, 3)
