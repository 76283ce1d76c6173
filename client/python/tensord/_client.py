"""tensord.Client: the Python face of one broker session (see tensord's docstring)."""

import sys
import threading

from . import _tensord
from ._tensord import Tensor


# Client.publish(stream=-1) as the C++ client reads it (tensord::kNoStream).
_NO_STREAM = (1 << 64) - 1


# tensord's dtype names, as Tensor.dtype gives them.
_DTYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "bfloat16", "float32", "float64", "complex64", "complex128")


def dtype_name(dtype):
    """'float32' from 'float32', from any spelling numpy.dtype() takes ('f4', '<f4',
    'single', 'float' is numpy's float64), from numpy.float32, numpy.dtype('float32') or
    torch.float32. A spelling tensord has no dtype for raises InvalidArgument naming the
    valid ones; an object that is no dtype at all raises TypeError."""
    if isinstance(dtype, str) and dtype in _DTYPE_NAMES:
        return dtype
    text = str(dtype)
    if not isinstance(dtype, str) and text.startswith("torch."):
        return text[len("torch."):]
    valid = ", ".join(_DTYPE_NAMES)
    try:
        import numpy
    except ImportError:
        if isinstance(dtype, str):
            raise _tensord.InvalidArgument(
                f"unknown dtype {dtype!r}: give one of {valid} (other spellings need numpy)") from None
        raise TypeError(f"not a dtype: {dtype!r}") from None
    try:
        resolved = numpy.dtype(dtype)
    except TypeError:
        if isinstance(dtype, str):
            raise _tensord.InvalidArgument(
                f"unknown dtype {dtype!r}: give one of {valid}, or a spelling numpy.dtype() takes") from None
        raise TypeError(f"not a dtype: {dtype!r}") from None
    if resolved.byteorder == (">" if sys.byteorder == "little" else "<"):
        raise _tensord.InvalidArgument(
            f"dtype {dtype!r} is not in this machine's byte order ({sys.byteorder}-endian), "
            "which tensord tensors are in")
    if resolved.name not in _DTYPE_NAMES:
        raise _tensord.InvalidArgument(f"dtype {dtype!r} (numpy's {resolved.name}) has no tensord "
                                       f"counterpart: give one of {valid}")
    return resolved.name


def device_tuple(device):
    """(device_type, device_id) as __dlpack_device__ gives it, from None or 'cpu', 'cuda',
    'cuda:1', 'xpu:0' (a Level Zero GPU, kDLOneAPI), a torch.device, or such a tuple. The id
    is this process's ordinal. The names are the memory kinds' own (tensord::MemoryKinds)."""
    if device is None:
        return (1, 0)
    if isinstance(device, tuple) and len(device) == 2:
        return (int(device[0]), int(device[1]))
    return _tensord._parse_device_name(str(device))


def _tags(tags):
    """tags as the core takes them: None, or a dict of str to str (TypeError otherwise)."""
    if tags is None:
        return None
    if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise TypeError(f"tags: a dict of str to str, not {tags!r}")
    return tags


def _shape(shape):
    if isinstance(shape, int):
        return [shape]
    return [int(d) for d in shape]


def _torch_stream(obj):
    """torch's current stream on obj's GPU, for a torch CUDA tensor; else None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type == "cuda":
        return torch.cuda.current_stream(obj.device).cuda_stream
    return None


def _torch_source(obj):
    """A torch tensor as something put() can read: detached, bool as its uint8 bytes."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return obj, None
    obj = obj.detach()
    if obj.dtype == torch.bool:  # torch refuses bool over DLPack
        return obj.view(torch.uint8), "bool"
    return obj, None


# Types whose __dlpack__ refused the max_version argument: asked without it from then on,
# so a put_many of numpy arrays does not raise and catch a TypeError per item.
_NO_MAX_VERSION = set()


_READABLE = ("an object with __dlpack__, the buffer protocol or __array_interface__ "
             "(a numpy array or a torch tensor, for example)")


def _as_numpy(obj):
    """obj (a list, a tuple, a scalar, ...) as numpy.asarray reads it, for an object that
    offers no array interface of its own. TypeError when numpy is missing or reads obj as
    an array of Python objects."""
    kind = type(obj).__name__
    try:
        import numpy
    except ImportError:
        raise TypeError(f"put: cannot read a {kind} without numpy to convert it: pass {_READABLE}") \
            from None
    try:
        array = numpy.asarray(obj)
    except (TypeError, ValueError) as e:
        raise TypeError(f"put: numpy cannot make an array of this {kind}: {e}") from None
    if array.dtype.hasobject:
        raise TypeError(f"put: numpy reads this {kind} as an array of Python objects, which tensord "
                        f"cannot hold: pass numbers, or {_READABLE}")
    return array


def source_of(obj):
    """An _Source over obj's memory: __dlpack__ (max_version first, then without it for
    producers that do not accept it, like numpy 1.24 and torch 1.13), else the buffer
    protocol, else the array interface; anything else (lists, tuples, scalars) as
    numpy.asarray reads it."""
    obj, override = _torch_source(obj)
    refusals = []
    dlpack = getattr(obj, "__dlpack__", None)
    if dlpack is not None:
        try:
            if type(obj) in _NO_MAX_VERSION:
                capsule = dlpack()
            else:
                try:
                    capsule = dlpack(max_version=_tensord.DLPACK_VERSION)
                except TypeError:
                    # Refused with max_version, taken without it: the type does not know the
                    # argument (whatever its error says), so it is not offered again.
                    capsule = dlpack()
                    _NO_MAX_VERSION.add(type(obj))
            source = _tensord._Source.from_dlpack(capsule)
        except (BufferError, RuntimeError, TypeError) as e:
            # numpy refuses bool and read-only arrays over DLPack; the buffer protocol takes
            # them. An unconsumed capsule frees itself.
            refusals.append(f"__dlpack__: {e}")
        else:
            if override:
                source.override_dtype(override)
            return source
    try:
        return _tensord._Source.from_buffer(obj)
    except (TypeError, BufferError, ValueError) as e:
        refusals.append(f"buffer protocol: {e}")
    if hasattr(obj, "__array_interface__"):
        return _tensord._Source.from_array_interface(obj)
    if dlpack is None:
        return source_of(_as_numpy(obj))
    raise TypeError(
        f"put: cannot read a {type(obj).__name__}: " + "; ".join(refusals or ["no __dlpack__, "
        "buffer protocol or __array_interface__"])
    )


class Watch:
    """Binding changes under a prefix, as dicts:
    {'kind': 'bound'|'unbound'|'reset', 'name', 'generation', 'tensor': info dict or None}.
    Iterating waits for each event (Ctrl-C interrupts); next(timeout) returns None when the
    timeout passes. close() (or leaving a with block) ends it and the iteration."""

    def __init__(self, core):
        self._core = core

    def __iter__(self):
        return self

    def __next__(self):
        return self._core.__next__()

    def next(self, timeout=None):
        """The next event, waiting up to timeout seconds (None: forever); None when none came."""
        return self._core.next(timeout)

    def close(self):
        """Ends the watch; an iteration over it stops."""
        self._core.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Client:
    """One session with the broker. Share it between threads freely; a forked child may use
    it too (it opens its own session on first use and never keeps the parent's alive).

    A Client pickles as its connection settings (the socket it talks to, its client name,
    lease-cache and allocate_ahead settings), so it can go to a spawned or forkserver
    worker, inside a Dataset or through a multiprocessing Queue: the copy connects to the
    same broker on its first call, and a broker that is down then raises Unavailable from
    that call, not from unpickling. Leases and tensors are not part of it, and neither is
    trust: the copy trusts only the daemon uids its receiver does (see connect())."""

    def __init__(self, core, settings):
        self.__core = core  # None: connects on first use
        self._settings = settings
        self._lock = threading.Lock()
        self._closed_before_use = False

    @property
    def _core(self):
        core = self.__core
        if core is not None:
            return core
        with self._lock:
            if self.__core is None:
                if self._closed_before_use:
                    raise ValueError("the tensord client is closed")
                # Only a copy from a pickle gets here (connect() hands its Client a core).
                socket = self._settings["socket"]
                self.__core = _connect_core(**self._settings, trusted_daemon_uids=_receiver_trust(socket))
            return self.__core

    def __reduce__(self):
        return (_unpickled_client, (dict(self._settings),))

    # Producing.

    def empty(self, shape, dtype, ns=None, device=None, tags=None):
        """A writable tensor in broker memory: fill it in place (numpy.from_dlpack(t),
        torch.from_dlpack(t) or t.numpy()), then publish(t, name). With a namespace it may be
        carved from that namespace's arena and can only be published into that namespace. A
        larger tensor with a namespace gets a recycled buffer: once it is gone (taken or
        unbound, every lease released) its memory serves this client's next empty() of about
        that size in that namespace, already mapped and faulted in, which is what makes a
        steady stream of big batches fast.

        Without a namespace the tensor gets a dedicated buffer (never an arena's), and a host
        one goes in the namespace this client last published a tensor from a plain empty()
        into, so a producer that keeps publishing into one namespace gets recycled buffers
        without saying ns=; published into another namespace after all, its bytes are copied
        once into a tensor of its own there (t then refers to that one).

        device: None or 'cpu' (host memory), or 'cuda:N' for this process's GPU N (the
        broker knows it by its UUID; each consumer sees its own ordinal for it). A CUDA
        tensor is filled through torch.from_dlpack(t) on a CUDA build of torch; .numpy()
        refuses it. Publish with stream= (the stream whose kernels wrote it) and consumers'
        streams wait for that work on the GPU: no synchronize needed. 'xpu:N' is Level Zero
        GPU N (kDLOneAPI); Level Zero has no default stream, so without stream= the ready
        event is signalled and waited on the host (docs/memory-backends.md).

        tags: a dict of str to str kept with the tensor (info dicts' 'tags'); publish(tags=)
        adds to them."""
        return self._core.empty(_shape(shape), dtype_name(dtype), ns, device_tuple(device), _tags(tags))

    def publish(self, t, name, if_absent=False, if_generation=None, ttl=None, wait=True, stream=None,
                tags=None, unbind_on_exit=False):
        """Seals the tensor from empty() and binds it to name, without a copy. if_absent /
        if_generation make it conditional; ttl (seconds) unbinds it after that long.
        Returns the tensor's description (a dict with 'generation', ...).

        GPU tensors: stream is the int handle of the stream whose work wrote the tensor
        (torch: torch.cuda.current_stream().cuda_stream); a ready event is recorded there,
        and every consumer's stream waits for it on the GPU. None: the legacy default
        stream. -1 (DLPack's "no synchronization"): the writes are done (the producer has
        synchronized), so no event is recorded; needed when a consumer cannot open this
        process's events, such as one in another PID namespace (a container that shares none
        with the producer). Host tensors ignore it.

        wait=False sends the publish and returns None at once, without a round trip: a
        producer loop runs ahead of the broker. What the broker refuses (a condition, the
        namespace) is raised by the next flush(), which names every failed publish. This
        client's later get/take of the name sees the publish (the stream keeps order).

        tags: a dict of str to str added to those given to empty() (a key given again is
        replaced).

        unbind_on_exit=True: the name is unbound when this client's session ends (the
        process exits, is killed, or closes the client), unless it was unbound or replaced
        before: for work nobody should take once its producer is gone. Leases already taken
        on it stay good."""
        if not isinstance(t, Tensor):
            raise TypeError("publish takes a tensor from client.empty(); use put() for other arrays")
        if stream == -1:
            stream = _NO_STREAM
        if not wait:
            self._core.publish_nowait(t, name, if_absent, if_generation, ttl, stream, _tags(tags), unbind_on_exit)
            return None
        return self._core.publish(t, name, if_absent, if_generation, ttl, stream, _tags(tags), unbind_on_exit)

    def put(self, name, obj, *, if_absent=False, if_generation=None, ttl=None, ns=None, stream=None,
            tags=None):
        """Copies any array once into broker memory and publishes it: anything with
        __dlpack__, the buffer protocol or __array_interface__, any strides, any dtype
        tensord has (bool and unsigned ints included), and what numpy.asarray reads (lists,
        tuples, scalars) when numpy is installed. Returns its description.

        A CUDA source (a torch CUDA tensor; anything whose __dlpack__ gives kDLCUDA) is
        copied device to device on stream into a broker-owned tensor on the same GPU, and
        published with a ready event there: no host round trip, no host wait. It must be in
        compact C order (.contiguous()). stream: as for publish(); for a torch tensor,
        torch's current stream when not given. tags: a dict of str to str kept with it."""
        if stream == -1:
            raise ValueError("put copies on a stream and publishes after it: pass that stream (or None), not -1")
        if stream is None:
            stream = _torch_stream(obj)
        source = source_of(obj)
        return self._core.put(name, source, if_absent, if_generation, ttl, ns, stream, _tags(tags))

    def put_many(self, items, *, if_absent=False, if_generation=None, ttl=None, ns=None, tags=None):
        """put() for a batch: items is a dict {name: array} or an iterable of (name, array)
        pairs, each array read as put() reads it. All the tensors are allocated in one
        pipelined batch (every request sent before any answer is read), each array is copied
        into its own, and all are published in a second pipelined batch: about two round
        trips however many items. The options apply to every item. Returns the descriptions
        in order. If any allocation fails, nothing is published and the error names the item
        (index and name); a publish that fails (if_absent on a bound name, ...) raises naming
        its item, and the items the broker accepted stay published."""
        pairs = items.items() if isinstance(items, dict) else items
        sources = [(name, source_of(obj)) for name, obj in pairs]
        return self._core.put_many(sources, if_absent, if_generation, ttl, ns, _tags(tags))

    # Consuming.

    def get(self, name, timeout=0.0, min_generation=None, readonly=False, pinned=False):
        """A lease on the tensor bound to name (or with this tensor id). timeout: 0 fails at
        once with NotFound, a positive number of seconds waits then raises Timeout, None
        waits forever; Ctrl-C interrupts a wait. min_generation waits for a binding at least
        that new. readonly=True maps the pages shared read-only instead of copy-on-write.
        pinned=True (a host tensor, with the cuda backend and a CUDA driver): the pages are
        also page-locked with cuMemHostRegister, so a copy to a GPU runs at full bus speed;
        __dlpack_device__() is (3, 0) (kDLCUDAHost), the view is read-only, .numpy() and
        .torch() give host arrays over the same memory. Without a driver: Unavailable."""
        return self._get(name, timeout, min_generation, readonly, pinned, None)

    def _get(self, name, timeout, min_generation, readonly, pinned, cancel):
        """get() whose wait a _CancelToken may end (tensord.aio's); cancel may be None."""
        if isinstance(name, int):
            return self._core.get_by_id(name, readonly, pinned)
        return self._core.get(name, timeout, min_generation, readonly, pinned, cancel)

    def get_many(self, names, timeout=0.0, min_generation=None, readonly=False, pinned=False):
        """get() for a batch of names, pipelined: every request is sent before any answer is
        read, and buffers not mapped yet are fetched together. Returns the tensors in order.
        All or nothing: if any name fails (NotFound, Timeout, ...), the leases the batch was
        granted are released and the error names the element (index and name). timeout,
        min_generation, readonly and pinned are as for get() and apply to every name; the
        names wait at the same time, so a positive timeout bounds the whole batch."""
        return self._get_many(names, timeout, min_generation, readonly, pinned, None)

    def _get_many(self, names, timeout, min_generation, readonly, pinned, cancel):
        """get_many() whose wait a _CancelToken may end (tensord.aio's); cancel may be None."""
        names = list(names)
        for n in names:
            if not isinstance(n, str):
                raise TypeError(f"get_many takes names, not {type(n).__name__}; "
                                "use get(tensor_id) for an id")
        return self._core.get_many(names, timeout, min_generation, readonly, pinned, cancel)

    def take(self, name_or_prefix, timeout=0.0, pinned=False, readonly=False):
        """Acquires and unbinds atomically. A prefix ending in '/' takes the oldest tensor
        published under it: a zero-copy work queue. timeout, pinned and readonly as for get().
        readonly=True suits a consumer that only reads (.numpy() is not writeable; .torch()
        warns that torch has no read-only tensors): besides no copy-on-write, releasing a
        recycled buffer then needs no check of this process's pages for private copies,
        which for big batches costs about as much CPU as reading one byte of every page.
        pinned=True is what a GPU trainer taking host batches wants (batch.to("cuda",
        non_blocking=True) then copies straight from the shared pages; a recycled buffer
        stays registered for the batches that reuse it). A take cannot be undone, so a
        pinned take without a CUDA driver raises Unavailable before taking anything, and a
        GPU tensor raises InvalidArgument and stays bound."""
        return self._core.take(name_or_prefix, timeout, pinned, readonly)

    def queue(self, prefix, depth=None):
        """A bounded work queue under prefix (a tensord.Queue), as queue.Queue(maxsize=depth)
        bounds one: producers give the depth, and their empty() and put() wait while depth
        tensors are in the queue; consumers get() the oldest."""
        from ._queue import Queue

        return Queue(self, prefix, depth)

    def take_many(self, name_or_prefix, max_count, timeout=0.0, pinned=False, readonly=False):
        """A batch from a work queue: up to max_count (at most 4096) takes, oldest first, in
        one round trip. timeout (as for take()) applies to the first; the rest are what is
        published already, so the list holds between 1 and max_count tensors. pinned and
        readonly as for take()."""
        return self._core.take_many(name_or_prefix, max_count, timeout, pinned, readonly)

    # Handing tensors to other processes.

    def hand_over(self, t, ttl=None):
        """A one-time token (a str) for tensor t, which another process redeems with
        redeem() for its own zero-copy lease. The broker holds the tensor for the token from
        now on, so t may be released, and this process may exit, at once. The token stays
        redeemable for ttl seconds (None: the broker's 60 s; at most 3600); one nobody
        redeems leaves nothing behind. t must be published (unnamed is fine). The token is a
        bearer secret: send it only where the tensor may go. Pickling a Tensor does this
        for you."""
        return self._core.hand_over(t, ttl)

    def redeem(self, token, readonly=False, pinned=False):
        """The Tensor a hand_over() token stands for, as a lease of this process's own
        (readonly and pinned as for get()). A token is spent once redeemed: NotFound when it
        was redeemed already or its time ran out; PermissionDenied (the token stays good)
        when this uid may not read the tensor."""
        return self._core.redeem(token, readonly, pinned)

    def cancel_hand_overs(self, tokens=None):
        """Ends hand_over() tokens this uid made (in any of its processes) that are still
        pending, and returns how many it ended: the given tokens (an iterable of str), or
        with None every one. Until a token is redeemed, expires or is cancelled, the memory
        of its tensor counts against this uid's --max-host-bytes-per-uid. Tokens that are
        not this uid's pending hand-overs (redeemed, expired, another uid's) are skipped."""
        return self._core.cancel_hand_overs(None if tokens is None else list(tokens))

    def watch(self, prefix="", initial=False):
        """A Watch of binding changes under prefix (initial=True starts with the current
        bindings)."""
        return Watch(self._core.watch(prefix, initial))

    # Managing.

    def delete(self, name, if_generation=None):
        """Unbinds name (only at that generation with if_generation); holders keep their data.
        NotFound when nothing is bound to it."""
        self._core.delete(name, if_generation)

    def list(self, prefix=""):
        """Descriptions (dicts) of the tensors bound under prefix, in name order, however
        many: read from the broker a page at a time. Each page is read as the names are
        then, so a name appears at most once, and one bound or unbound meanwhile is listed
        if it was bound when its page was read."""
        return self._core.list(prefix)

    def list_page(self, prefix="", page_token="", limit=0):
        """One page of list(prefix): (descriptions, next_page_token). Pass next_page_token
        back, with the same prefix, for the next page; "" means nothing is left. limit bounds
        the page's length (0: as many as one answer holds, at most 4096)."""
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"list_page: limit is an int, not {limit!r}")
        if limit < 0:
            raise _tensord.InvalidArgument(f"list of '{prefix}': a page of {limit} entries; give 0 or more")
        return self._core.list_page(prefix, page_token, min(limit, 1 << 32))

    def iter_list(self, prefix=""):
        """The descriptions list(prefix) returns, one at a time, a page read when the last is
        used up: for going through a large listing without holding all of it."""
        token = ""
        while True:
            page, token = self.list_page(prefix, token)
            yield from page
            if not token:
                return

    def stat(self, name):
        """A tensor's description plus 'holders': one dict per session holding leases
        (session_id, pid, uid, gid, leases, producer). An int is a tensor id."""
        if isinstance(name, int):
            return self._core.stat_by_id(name)
        return self._core.stat(name)

    def status(self, sessions=False, queues=False):
        """The broker's status as a dict; with sessions=True also "session_usage", the
        sessions this uid may see (all of them for root and the daemon's uid) and what each
        holds; with queues=True "queues" lists the bounded work queues of namespaces this uid
        may read (Queue.stats() describes the fields)."""
        return self._core.status(sessions, queues)

    def flush(self):
        """Sends queued lease releases now and waits until the broker has them. Raises the
        error of the publishes sent with wait=False since the last flush that failed (the
        first one's kind; the message names them)."""
        self._core.flush()

    def close(self):
        """Ends the session; tensors and views already made stay valid."""
        with self._lock:
            if self.__core is None:
                self._closed_before_use = True
                return
        self.__core.close()

    @property
    def closed(self):
        """True once close() ended the session."""
        if self.__core is None:
            return self._closed_before_use
        return self.__core.closed

    @property
    def session_id(self):
        """The broker's id of this session (it connects a pickled copy first)."""
        return self._core.session_id

    @property
    def socket(self):
        """The socket path of the broker this client talks to."""
        return self._settings["socket"]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.closed:
            return "<tensord.Client closed>"
        if self.__core is None:
            return f"<tensord.Client socket={self.socket!r} not connected yet>"
        return f"<tensord.Client socket={self.socket!r} session={self.session_id}>"


def _connect_core(socket, client_name, lease_cache, lease_cache_linger, trusted_daemon_uids=(),
                  allocate_ahead=False):
    return _tensord._Client.connect(socket, client_name, lease_cache, lease_cache_linger,
                                    list(trusted_daemon_uids or ()), bool(allocate_ahead))


def _uid_list(uids):
    """trusted_daemon_uids as connect() takes it: None, or an iterable of uids (ints)."""
    if uids is None:
        return None
    if isinstance(uids, (str, bytes)):
        raise TypeError("trusted_daemon_uids: an iterable of uids (ints), not a string")
    out = []
    for uid in uids:
        if isinstance(uid, bool) or not isinstance(uid, int):
            raise TypeError(f"trusted_daemon_uids: {uid!r} is not a uid (an int)")
        if not 0 <= uid < 2**32 - 1:
            raise ValueError(f"trusted_daemon_uids: {uid} is not a uid (0 to 4294967294)")
        out.append(uid)
    return tuple(out)


# Trust is never taken from a pickle. A client made by unpickling trusts (besides root and
# our own uid) what connect() would here: the uids this process's own code passed to
# connect() for that socket, or, where it named none, $TENSORD_TRUSTED_DAEMON_UIDS, which
# the C++ client reads (and refuses when malformed). A pickle may come from anyone who can
# write to a queue, a pipe or a file, and it must not make this process talk to (and hand
# its data to, or take data from) a daemon it would refuse itself. Only connect() adds to
# this table, and only ever adds.
_trusted_by_socket: "dict[str, frozenset]" = {}
# The clients that unpickled Tensors redeem their hand-overs with: one per broker socket in
# this process, connected on the first use.
_redeemers: "dict[str, Client]" = {}
_lock = threading.Lock()  # guards both


def _receiver_trust(socket):
    """The daemon uids a client unpickled here trusts for socket: () leaves it to the
    environment, as connect() without trusted_daemon_uids does."""
    with _lock:
        return tuple(sorted(_trusted_by_socket.get(
            socket if socket is not None else _tensord.default_socket_path(), ())))


# What a pickled Client carries: how to connect, never whom to trust.
_PICKLED_SETTINGS = ("socket", "client_name", "lease_cache", "lease_cache_linger", "allocate_ahead")


def _unpickled_client(settings):
    # Settings pickled before trust stopped travelling hold "trusted_daemon_uids": dropped,
    # like any key a crafted pickle adds.
    return Client(None, {key: settings[key] for key in _PICKLED_SETTINGS if key in settings})


def _redeemer(socket):
    with _lock:
        client = _redeemers.get(socket)
        if client is None:
            client = _redeemers[socket] = Client(
                None, {"socket": socket, "client_name": None, "lease_cache": True, "lease_cache_linger": 2.0})
        return client


def _pickled_tensor(t):
    # A pickled Tensor is a hand-over token, redeemed when it is unpickled: the receiver gets
    # its own zero-copy lease, and the sender may let its tensor go at once.
    token, socket = t._hand_over()
    return (_unpickled_tensor, (socket, token, t.readonly))


def _unpickled_tensor(socket, token, readonly, _sender_trust=()):
    # _sender_trust: what pickles made before trust stopped travelling carry; ignored. A
    # daemon this process does not trust raises PermissionDenied before the token is sent,
    # and the token stays good.
    return _redeemer(socket).redeem(token, readonly=readonly)


def connect(socket=None, *, client_name=None, lease_cache=True, lease_cache_linger=2.0,
            trusted_daemon_uids=None, allocate_ahead=False):
    """Connects to the broker. socket: the daemon's socket path; default $TENSORD_SOCKET,
    else the per-user socket if one is there, else /run/tensord/tensord.sock. lease_cache
    keeps a lease for lease_cache_linger seconds after its last view goes, while the name
    still points at it, so a repeated get() needs no round trip.

    trusted_daemon_uids: uids besides root and this process's own that the daemon may run
    as (a daemon run as a dedicated user, such as uid 10001 in deploy/); None (or empty):
    $TENSORD_TRUSTED_DAEMON_UIDS (comma-separated uids) if set. A daemon of any other uid is
    refused with PermissionDenied, before anything is sent to it. Pickles never carry the
    list: a Client or Tensor unpickled in this process trusts, for its socket, the uids that
    this process's connect() calls gave for that socket, or, where they gave none,
    $TENSORD_TRUSTED_DAEMON_UIDS.
    A spawned worker has the parent's environment but none of its connect() calls: set
    $TENSORD_TRUSTED_DAEMON_UIDS before it starts, or connect() in it first.

    allocate_ahead: for a steady producer (a worker filling batches of one shape): once
    empty(ns=...) was given a recycled-kind buffer, the next empty() of the same shape,
    dtype, tags and namespace is asked for at once, so the broker grants it while this one
    is filled. It holds one more buffer, counted in the quota; an empty() of anything else
    gives the early one up. Pickled clients carry the setting."""
    settings = {"socket": None if socket is None else str(socket), "client_name": client_name,
                "lease_cache": lease_cache, "lease_cache_linger": lease_cache_linger,
                "allocate_ahead": bool(allocate_ahead)}
    trusted = _uid_list(trusted_daemon_uids)
    core = _connect_core(**settings, trusted_daemon_uids=trusted)
    settings["socket"] = core.socket  # a copy talks to this broker, whatever its environment
    if trusted:
        with _lock:
            _trusted_by_socket[core.socket] = _trusted_by_socket.get(core.socket, frozenset()).union(trusted)
    return Client(core, settings)
