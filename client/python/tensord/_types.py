"""A tensor's dtype and device as values that compare equal to numpy's and torch's."""

from . import _tensord
from ._client import device_tuple, dtype_name

# The memory kinds' user names by DLPack device type ('cpu', 'cuda', 'cuda_host', 'xpu').
_DEVICE_NAMES = {kind["device_type"]: kind["device_prefix"] for kind in _tensord._memory_kinds()}


def _comparisons(base, canonical):
    """__eq__ and __ne__ for a subclass of `base` whose values also equal anything that
    canonical() turns into an equal `base` value (NotImplemented for what it refuses)."""

    def eq(self, other):
        if isinstance(other, base):
            return base.__eq__(self, other)
        try:
            return base.__eq__(self, canonical(other))
        except (TypeError, ValueError):
            return NotImplemented

    def ne(self, other):
        equal = eq(self, other)
        return equal if equal is NotImplemented else not equal

    return eq, ne


class DType(str):
    """A tensor's dtype: its name ('float32'), a str, which also compares equal to the same
    dtype as numpy and torch spell it: numpy.float32, numpy.dtype('float32'), torch.float32.
    .numpy() and .torch() give those objects."""

    __slots__ = ()
    __eq__, __ne__ = _comparisons(str, dtype_name)
    __hash__ = str.__hash__

    def numpy(self):
        """The numpy dtype (TypeError for bfloat16, which numpy lacks)."""
        import numpy

        if self == "bfloat16":
            raise TypeError("numpy has no bfloat16 dtype")
        return numpy.dtype(str(self))

    def torch(self):
        """The torch dtype (TypeError where this torch lacks it: uint16-64 before torch 2.3)."""
        import torch

        found = getattr(torch, str(self), None)
        if not isinstance(found, torch.dtype):
            raise TypeError(f"torch {torch.__version__} has no {self} dtype")
        return found


class Device(tuple):
    """A tensor's device as __dlpack_device__() gives it, (device_type, device_id), which also
    compares equal to the same device as torch or a string names it: torch.device('cuda:0'),
    'cuda:0', 'cuda' (device 0), 'cpu', 'xpu:1'. The id is this process's ordinal.
    str() gives 'cpu', 'cuda:0', 'xpu:1', or 'cuda_host' for a pinned view."""

    __slots__ = ()

    def __new__(cls, pair):
        return super().__new__(cls, (int(pair[0]), int(pair[1])))

    __eq__, __ne__ = _comparisons(tuple, device_tuple)
    __hash__ = tuple.__hash__

    @property
    def type(self):
        """'cpu', 'cuda', 'xpu' or 'cuda_host' (a pinned view); the DLPack code where tensord has no name for it."""
        return _DEVICE_NAMES.get(self[0], str(self[0]))

    @property
    def id(self):
        """The device id: this process's ordinal (tuple's own index() stays a method)."""
        return self[1]

    def __str__(self):
        return _tensord._device_name(self[0], self[1])
