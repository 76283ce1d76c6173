"""Tensor -> numpy / torch, including dtypes a framework refuses over DLPack.

What Debian's numpy 1.24 and torch 1.13 do with a DLPack capsule (pinned by the tests):
  numpy.from_dlpack  refuses bool (kDLBool) and bfloat16: "Unsupported dtype in DLTensor".
  torch.from_dlpack  refuses bool ("Unsupported code 6") and uint16/uint32/uint64
                     ("Unsupported kUInt bits N").
  Neither accepts a versioned capsule nor a max_version argument, so both get legacy
  capsules, which cannot say "read-only".
  torch.from_dlpack  refuses kDLCUDAHost ("Unsupported device_type: 3"), the device of a
                     pinned view.
Newer releases take some of these (numpy 2: bool, and a versioned capsule that says
read-only; torch 2.3 and later: uint16/32/64); the tests check either behaviour.
Workarounds here, all zero-copy:
  .numpy()  builds the array over the raw memory with numpy's C API, with an object
            holding its own lease as the array's base: every dtype numpy has (bool
            included); a read-only mapping gives a non-writeable array; bfloat16 raises
            TypeError (numpy has no such dtype).
  .torch()  bool: the bytes as a uint8 tensor, then .view(torch.bool) (same storage).
            uint16/32/64: TypeError naming the dtype, unless reinterpret_unsigned=True asks
            for the same bits as the signed type of the same width.
            A read-only mapping: torch has no read-only tensors, so this warns the way
            torch.from_numpy does for a non-writeable array (writing to it would crash).
            A pinned view (read-only too): a CPU tensor over the same pages, its capsule
            saying kDLCPU. torch's is_pinned() asks the CUDA runtime: False on a machine
            without a GPU, True on one (torch 2.11 on an H200).
"""

import warnings

_KDLCPU, _KDLCUDAHOST = 1, 3
_UNSIGNED_WIDE = {"uint16": "int16", "uint32": "int32", "uint64": "int64"}


def to_numpy(self):
    """A numpy array over this tensor's memory (no copy).

    The array holds its own reference on the lease: it stays valid after release() and
    after the tensor object is gone. Read-only gets give a non-writeable array. A tensor on
    a GPU raises TypeError: numpy reads host memory only.
    """
    device_type, device_id = self.__dlpack_device__()
    if device_type not in (_KDLCPU, _KDLCUDAHOST):  # a pinned view is host memory too
        raise TypeError(
            f"tensord tensor {self.name or self.tensor_id!r} lives on device ({device_type}, {device_id}), "
            "not in host memory: numpy cannot read it; use torch.from_dlpack(t) with a CUDA build of torch"
        )
    return self._numpy()


def _capsule_as(self, dtype):
    """A legacy capsule of the elements as dtype, for torch.from_dlpack(capsule). A capsule
    carries no stream, so for a GPU tensor torch's current stream is ordered here, as
    __dlpack__(stream=...) would order it."""
    if self.__dlpack_device__()[0] == 2:
        import torch

        self.use_on_stream(torch.cuda.current_stream().cuda_stream or 1)
    return self._legacy_capsule_as(dtype)


def to_torch(self, *, reinterpret_unsigned=False):
    """A torch tensor over this tensor's memory (no copy).

    bool works although torch refuses bool over DLPack. uint16/uint32/uint64 raise
    TypeError where torch lacks them, unless reinterpret_unsigned=True (the same bits as
    int16/int32/int64). The torch tensor holds its own reference on the lease.
    """
    import torch

    dtype = self.dtype
    if dtype == "bool":
        return torch.from_dlpack(_capsule_as(self, "uint8")).view(torch.bool)
    if self.readonly:
        warnings.warn(
            f"tensord tensor {self.name or self.tensor_id!r} is a read-only mapping and torch "
            "has no read-only tensors: writing to this tensor crashes the process",
            UserWarning,
            stacklevel=2,
        )
        return torch.from_dlpack(_capsule_as(self, dtype))
    if dtype in _UNSIGNED_WIDE:
        try:
            return torch.from_dlpack(self)
        except RuntimeError:
            # torch < 2.3 has no uint16/32/64; the refused capsule frees its reference.
            if not reinterpret_unsigned:
                raise TypeError(
                    f"torch {torch.__version__} has no {dtype} tensors: use .numpy(), or "
                    f".torch(reinterpret_unsigned=True) for the same bits as "
                    f"{_UNSIGNED_WIDE[dtype]}"
                ) from None
            return torch.from_dlpack(_capsule_as(self, _UNSIGNED_WIDE[dtype]))
    return torch.from_dlpack(self)


def to_array(self, dtype=None, copy=None):
    """numpy's __array__ hook: numpy.asarray(t) is t.numpy()."""
    array = to_numpy(self)
    if dtype is not None and array.dtype != dtype:
        return array.astype(dtype)
    return array
