#!/usr/bin/python3
"""Writes the hand-made seed inputs under tests/fuzz/corpus/<target>/.

The seeds are committed; run this (Debian's python3 with python3-numpy) only to change them.
Most fuzzers read their input through libFuzzer's FuzzedDataProvider, so the seeds are
encoded the way it decodes: strings from the front (a backslash followed by any other byte
ends one), integers from the back, most significant byte first. `Fdp` mirrors that.
"""
import io
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class Fdp:
    """Builds an input that FuzzedDataProvider reads back as the calls made here, in order."""

    def __init__(self):
        self.front = bytearray()
        self.back = []  # bytes in the order they are consumed (from the end of the data)

    def integral(self, lo, hi, value):
        assert lo <= value <= hi
        span, offset, raw = hi - lo, value - lo, []
        shift = 0
        while shift < 64 and (span >> shift) > 0:
            raw.append(0)
            shift += 8
        for i in range(len(raw)):  # the first byte consumed is the most significant
            raw[i] = (offset >> (8 * (len(raw) - 1 - i))) & 0xFF
        self.back.extend(raw)
        return self

    def boolean(self, value):
        return self.integral(0, 255, 1 if value else 0)

    def u64(self, value):
        return self.integral(0, 2**64 - 1, value)

    def string(self, text):
        data = text.encode("latin-1") if isinstance(text, str) else bytes(text)
        self.front += data.replace(b"\\", b"\\\\") + b"\\x"  # "\x" ends the string
        return self

    def data(self):
        return bytes(self.front) + bytes(reversed(self.back))


def varint(n):
    out = bytearray()
    n &= 2**64 - 1
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, wire_type, payload):
    key = varint(number << 3 | wire_type)
    if wire_type == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def desc(code=3, bits=32, shape=(), strides=None, byte_offset=0, device=1, index=0):
    """A serialized tensord.v1.TensorDesc."""
    dtype = field(1, 0, code) + field(2, 0, bits) + field(3, 0, 1)
    out = field(1, 2, dtype)
    if shape:
        out += field(2, 2, b"".join(varint(d) for d in shape))
    if strides:
        out += field(3, 2, b"".join(varint(s) for s in strides))
    if byte_offset:
        out += field(4, 0, byte_offset)
    dev = field(1, 0, device) + (field(2, 0, index) if index else b"")
    return out + field(5, 2, dev)


def write(target, name, data):
    directory = os.path.join(HERE, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def tensor_desc_seeds():
    seeds = {
        "float32_2x3": desc(shape=(2, 3)),
        "int64_scalar": desc(code=1, bits=64),
        "uint8_strided": desc(code=2, bits=8, shape=(4, 4), strides=(8, 2), byte_offset=3),
        "bool_empty": desc(code=7, bits=8, shape=(0, 5)),
        "complex128_cuda": desc(code=6, bits=128, shape=(7,), device=2, index=1),
        "bfloat16_broadcast": desc(code=5, bits=16, shape=(3, 1, 2), strides=(0, 9, 1)),
        "too_large": desc(shape=(2**40, 2**40)),
        "negative_dim": desc(shape=(2**64 - 1,)),
    }
    for name, serialized in seeds.items():
        # ConsumeBool (true: a serialized desc), then the desc as a string.
        write("fuzz_tensor_desc", name, Fdp().boolean(True).string(serialized).data())


def npy_seeds():
    import numpy as np

    arrays = {
        "float32_3x4": np.arange(12, dtype=np.float32).reshape(3, 4),
        "int64_scalar": np.array(7, dtype=np.int64),
        "bool_5": np.array([True, False, True, True, False]),
        "fortran_2x3": np.asfortranarray(np.ones((2, 3), dtype=np.float64)),
        "complex64_empty": np.zeros((0, 3), dtype=np.complex64),
        "uint16_1": np.array([65535], dtype=np.uint16),
        "bigendian_f4": np.arange(3, dtype=">f4"),
    }
    for name, array in arrays.items():
        buffer = io.BytesIO()
        np.save(buffer, array)
        write("fuzz_npy", name, buffer.getvalue())
    # A version 2.0 header (4-byte length), written by hand.
    header = b"{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }"
    header += b" " * ((64 - (12 + len(header) + 1) % 64) % 64) + b"\n"
    write("fuzz_npy", "version2_i2",
          b"\x93NUMPY\x02\x00" + struct.pack("<I", len(header)) + header + b"\x01\x00\x02\x00")


def names_seeds():
    pairs = {
        "name_and_prefix": ("ns/a/b", "ns/"),
        "namespace": ("shared", "shared"),
        "dots": ("ns/./a", "ns/a.b_c-d"),
        "long_segment": ("ns/" + "x" * 256, ""),
        "binary": ("ns/\x00\xff", "/"),
        "trailing_slash": ("ns/a/", "ns//"),
    }
    for name, (a, b) in pairs.items():
        write("fuzz_names", name, Fdp().string(a).data() + b.encode("latin-1"))


def fd_channel_seeds():
    hello = field(1, 0, 7) + field(2, 2, field(1, 0, 1) + field(2, 2, b"seed"))  # FdRequest
    fetch = field(1, 0, 8) + field(3, 2, field(1, 2, varint(1) + varint(2)))
    # Raw receive: ConsumeBool(true), the bytes, the length case, fds, headers, max_fds.
    raw = (Fdp().boolean(True).string(hello).integral(0, 7, 5).boolean(True).integral(0, 4, 1)
           .boolean(False).boolean(True).integral(0, 4, 1))
    write("fuzz_fd_channel_message", "hello_one_fd", raw.data())
    raw = (Fdp().boolean(True).string(fetch).integral(0, 7, 5).boolean(False)
           .integral(0, 253, 3).boolean(True).boolean(True).integral(0, 4, 2))
    write("fuzz_fd_channel_message", "too_many_fds", raw.data())
    welcome = field(1, 0, 1) + field(2, 2, field(1, 0, 1) + field(3, 0, 5))  # FdResponse
    write("fuzz_fd_channel_message", "welcome_round_trip",
          Fdp().boolean(False).string(welcome).integral(0, 3, 1).data())


# The broker fuzzer's op numbers (Harness::Step in fuzz_broker_requests.cc; the ops in fuzz_broker_ops.cc).
OPEN, CLOSE, ALLOCATE, EXPORT, SEAL, PUBLISH, ACQUIRE, TAKE, RELEASE, DELETE, LIST, WATCH, \
    CANCEL, SINK, RAW = 0, 1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16


def broker_seeds():
    def op(f, number):
        return f.integral(0, 16, number)

    def pick_known(f, index, count):
        # Pick(): not the random branch, then the index among known ids.
        f.integral(0, 5, 1)
        if count > 1:
            f.integral(0, count - 1, index)
        return f

    def open_session(f, identity=0, name="seed"):
        op(f, OPEN).integral(0, 5, identity).string(name).string("forged-token")
        return f

    def allocate(f, session_index, sessions, count):
        op(f, ALLOCATE)
        f.integral(0, 9, 1).integral(0, 7, 1)  # Namespace(): the pool's "ns"
        f.integral(0, 4, 1)  # Desc(): plain float32
        f.integral(0, 3, 1)  # ndim 1
        f.integral(0, 7, 1).integral(0, 300, count)
        f.boolean(False)  # isolated
        f.integral(0, 9, 1).integral(0, 2, 0)  # no tags
        pick_known(f, session_index, sessions)
        return f

    def fetch_and_seal(f, session_index, sessions, buffer_index, buffers):
        op(f, SEAL)
        pick_known(f, session_index, sessions)
        f.integral(0, 9, 1).integral(1, 2, 1)
        pick_known(f, buffer_index, buffers)
        f.integral(0, 4, 1)  # seal
        return f

    def publish(f, tensor_index, tensors, name_index, session_index, sessions):
        op(f, PUBLISH)
        pick_known(f, tensor_index, tensors)
        f.integral(0, 4, 1)  # named
        f.integral(0, 9, 5).integral(0, 8, name_index)  # Name(): the pool
        f.integral(0, 3, 3)  # no condition
        f.boolean(False)  # no TTL
        pick_known(f, session_index, sessions)
        return f

    def acquire(f, name_index, wait_case, session_index, sessions):
        op(f, ACQUIRE)
        f.integral(0, 4, 2).integral(0, 9, 5).integral(0, 8, name_index)
        f.integral(0, 4, wait_case)
        if wait_case == 2:
            pass
        f.integral(0, 3, 1)  # no min_generation
        pick_known(f, session_index, sessions)
        return f

    def release_all(f, lease_indexes, leases, session_index, sessions):
        op(f, RELEASE)
        f.integral(0, 63, 1).integral(0, 6, len(lease_indexes))
        for index in lease_indexes:
            pick_known(f, index, leases)
        pick_known(f, session_index, sessions)
        return f

    def listing(f, prefix_index, session_index, sessions):
        op(f, LIST)
        f.integral(0, 7, 1).integral(0, 9, prefix_index)
        pick_known(f, session_index, sessions)
        f.boolean(True).integral(0, 9, 5).integral(0, 8, 0)  # Stat by name "ns/a"
        pick_known(f, session_index, sessions)
        return f

    # Produce and consume: open, allocate, seal, publish "ns/a", a second session acquires
    # it, everyone releases, list.
    f = Fdp()
    open_session(f)
    allocate(f, 0, 1, 16)
    fetch_and_seal(f, 0, 1, 0, 1)
    publish(f, 0, 1, 0, 0, 1)
    open_session(f, identity=2, name="reader")
    acquire(f, 0, 0, 1, 2)
    release_all(f, [0, 1], 2, 0, 2)
    listing(f, 1, 1, 2)
    write("fuzz_broker_requests", "produce_consume", f.data())

    # A waiting acquire that a later publish completes.
    f = Fdp()
    open_session(f)
    acquire(f, 1, 2, 0, 1)  # "ns/b", 60 s
    allocate(f, 0, 1, 4)
    fetch_and_seal(f, 0, 1, 0, 1)
    publish(f, 0, 1, 1, 0, 1)
    op(f, CLOSE)
    pick_known(f, 0, 1)
    write("fuzz_broker_requests", "wait_then_publish", f.data())

    # A foreign uid against the ACLs: allocate in "shared" and publish there.
    f = Fdp()
    open_session(f, identity=3, name="writer")
    op(f, ALLOCATE)
    f.integral(0, 9, 1).integral(0, 7, 2)  # "shared"
    f.integral(0, 4, 1).integral(0, 3, 0)  # plain, 0 dims
    f.boolean(False).integral(0, 9, 1).integral(0, 2, 0)
    pick_known(f, 0, 1)
    write("fuzz_broker_requests", "acl_writer", f.data())


def main():
    tensor_desc_seeds()
    npy_seeds()
    names_seeds()
    fd_channel_seeds()
    broker_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
