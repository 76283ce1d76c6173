"""Tensor.to_dlpack(): the capsule for consumers that take one with no stream, as
TensorFlow's tf.experimental.dlpack.from_dlpack does (TensorFlow cannot be installed here).
A hand-made consumer applies TensorFlow's rules (tensorflow/c/eager/dlpack.cc): an
unversioned capsule named "dltensor", strides compact row-major (or none), byte_offset 0,
and data it may read at once, since it passes no stream to wait on. The GPU half of "at
once" (a host wait on the producer's ready event) runs against the CUDA stand-in in
cuda_fake/test_cuda_fake.py."""

import ctypes

import numpy as np
import pytest

import tensord

_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.restype = ctypes.c_int
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor)))]


def tf_like_from_dlpack(capsule):
    """What TensorFlow's from_dlpack checks and reads, in the same order: the capsule name,
    a CPU or CUDA device, compact strides, then the bytes at data (+ byte_offset, which some
    versions refuse unless 0). Consumes the capsule as TensorFlow does (renames it, calls the
    deleter when done) and returns (shape, strides, byte_offset, the bytes)."""
    if _get_name(capsule) != b"dltensor":
        raise ValueError("TensorFlow takes only an unversioned 'dltensor' capsule")
    managed = ctypes.cast(_get_pointer(capsule, b"dltensor"), ctypes.POINTER(DLManagedTensor)).contents
    t = managed.dl_tensor
    if t.device.device_type not in (1, 2):  # kDLCPU, kDLCUDA
        raise ValueError(f"TensorFlow cannot take device type {t.device.device_type}")
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = [t.strides[i] for i in range(t.ndim)] if t.strides else None
    if strides is not None:
        expected = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and strides[i] != expected:
                raise ValueError("Invalid strides array from DLPack")
            expected *= shape[i]
    nbytes = int(np.prod(shape)) * (t.dtype.bits // 8) * t.dtype.lanes
    data = ctypes.string_at(t.data + t.byte_offset, nbytes) if t.device.device_type == 1 else None
    if _set_name(capsule, b"used_dltensor") != 0:
        raise RuntimeError("cannot rename the capsule")
    result = (shape, strides, t.byte_offset, data)
    managed.deleter(ctypes.pointer(managed))
    return result


def test_to_dlpack_gives_what_tensorflow_takes_and_reads(client, name):
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    n = name()
    client.put(n, values)
    t = client.get(n)
    capsule = t.to_dlpack()
    shape, strides, byte_offset, data = tf_like_from_dlpack(capsule)
    assert shape == [2, 3, 4]
    assert strides == [12, 4, 1]
    assert byte_offset == 0
    assert np.array_equal(np.frombuffer(data, dtype=np.float32).reshape(2, 3, 4), values)


def test_to_dlpack_of_a_tensor_inside_an_arena_folds_its_offset_into_the_pointer(client, name):
    # Small tensors of one namespace share an arena: the second one starts past the first.
    n1, n2 = name(), name()
    ns = n1.split("/")[0]
    client.put(n1, np.zeros(16, dtype=np.int32), ns=ns)
    client.put(n2, np.arange(16, dtype=np.int32), ns=ns)
    t = client.get(n2)
    assert client.stat(n1)["buffer_id"] == client.stat(n2)["buffer_id"], "not in one arena: nothing to fold"
    assert t.info["buffer_offset"] > 0
    _, _, byte_offset, data = tf_like_from_dlpack(t.to_dlpack())
    assert byte_offset == 0
    assert np.array_equal(np.frombuffer(data, dtype=np.int32), np.arange(16, dtype=np.int32))


def test_to_dlpack_keeps_the_lease_until_the_consumer_lets_go(client, name):
    n = name()
    client.put(n, np.ones(8, dtype=np.float64))
    t = client.get(n)
    capsule = t.to_dlpack()
    t.release()
    assert client.stat(n)["holders"], "the capsule holds no lease of its own"
    tf_like_from_dlpack(capsule)  # the consumer's deleter drops it
    client.flush()


def test_to_dlpack_refuses_a_read_only_view(client, name):
    n = name()
    client.put(n, np.ones(8, dtype=np.float32))
    with pytest.raises(BufferError, match="read-only.*to_dlpack"):
        client.get(n, readonly=True).to_dlpack()


@pytest.mark.parametrize("shape, strides, compact", [
    ((2, 3), (3, 1), True),
    ((2, 3), (1, 2), False),
    ((1, 3), (99, 1), True),  # a dimension of one may have any stride
    ((2, 1, 3), (3, 7, 1), True),
    ((0, 3), (5, 9), True),  # no elements: nothing to misread
    ((4,), (2,), False),
    ((), (), True),
])
def test_the_compact_rule_is_tensorflows(shape, strides, compact):
    assert tensord._tensord._compact_row_major(list(shape), list(strides)) == compact
