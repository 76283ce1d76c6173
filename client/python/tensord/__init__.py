"""tensord: share tensors between processes on one node without copying them.

    import tensord, torch
    client = tensord.connect()                     # $TENSORD_SOCKET or the default socket
    client.put("demo/weights", torch.randn(1000))  # one copy into broker memory
    t = client.get("demo/weights", timeout=5.0)    # a lease; no copy
    w = torch.from_dlpack(t)                       # or t.torch(), t.numpy(), numpy.from_dlpack(t)

    buf = client.empty((64, 3, 224, 224), "float32")  # fill in place, publish without a copy
    torch.from_dlpack(buf).normal_()
    client.publish(buf, "demo/batch/0001")
    batch = client.take("demo/batch/", timeout=None)  # oldest under the prefix, unbinds it

    q = client.queue("demo/frames/", depth=4)      # bounded: put() waits while 4 are in it
    q.put(torch.randn(3, 224, 224))
    frame = q.get()                                # the oldest (usually in another process)

Lifetime: a tensor from get() or take() holds a lease; every view made from it (numpy array,
torch tensor, DLPack capsule) holds its own reference, and the lease goes when the last of
them is garbage-collected (the client may keep it cached briefly while the name still points
at it), when the process exits or is killed, or, for the handle's own reference, at once with
release() or at the end of a with block.

Other processes: a Client pickles as its connection settings, and a Tensor pickles as a
hand-over token (Client.hand_over): put one in a multiprocessing Queue or Pipe, or return it
from a worker, and the receiver unpickles its own zero-copy lease on the same memory. The
broker holds the tensor for the token, so the sender may let its tensor go at once; an
unpickled token is spent, and one never unpickled expires after 60 s, leaving nothing.
A pickle carries no trust: the receiver talks only to a daemon whose uid it trusts itself
(root, its own, its connect(trusted_daemon_uids=...) for that socket, or
$TENSORD_TRUSTED_DAEMON_UIDS), and raises PermissionDenied for any other.

Errors are tensord.Error subclasses carrying the broker's message: NotFound, Timeout,
ResourceExhausted, PermissionDenied, InvalidArgument, Unavailable; other codes raise Error
with .code set. Timeout is also a TimeoutError, NotFound also a LookupError.
"""

def _cxx_runtime_in_global_scope():
    """Loads the C++ runtime into the process's global symbol scope before the extension,
    which would otherwise load it privately (RTLD_LOCAL), as a dependency of its own. On the
    GPU image (torch 2.11, Python 3.12) `import tensord, torch` then died with SIGSEGV in
    torch's first std::call_once, a null call from pthread_once, 10 times out of 10; with
    libstdc++ global first, as it is when torch is imported first, 0 out of 10
    (docs/gpu-runs/2026-11-27-h200-71a1458). Why the order matters is not fully explained:
    torch's call_once symbols bind to the same libstdc++ either way."""
    import ctypes

    try:
        ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
    except OSError:  # no libstdc++ by that name: the extension's own loader finds its runtime
        pass


_cxx_runtime_in_global_scope()

from . import _convert, aio, data  # noqa: E402  (after the runtime is global)
from . import _client  # noqa: E402
from ._client import Client, Watch, connect, dtype_name
from ._queue import Queue
from ._types import Device, DType
from ._version import __version__  # the project version, written by CMake
from ._tensord import (
    DLPACK_VERSION,
    Error,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Tensor,
    Timeout,
    Unavailable,
    default_socket_path,
)

_core_dtype, _core_device = Tensor.dtype, Tensor.device
Tensor.dtype = property(lambda t: DType(_core_dtype.fget(t)), doc=DType.__doc__)
Tensor.device = property(lambda t: Device(_core_device.fget(t)), doc=Device.__doc__)


Tensor.__reduce__ = _client._pickled_tensor
Tensor.numpy = _convert.to_numpy
Tensor.torch = _convert.to_torch
Tensor.__array__ = _convert.to_array

__all__ = [
    "Client",
    "DLPACK_VERSION",
    "DType",
    "Device",
    "Error",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "Queue",
    "ResourceExhausted",
    "Tensor",
    "Timeout",
    "Unavailable",
    "Watch",
    "connect",
    "default_socket_path",
    "dtype_name",
]
