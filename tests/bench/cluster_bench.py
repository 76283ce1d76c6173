"""Cross-node acquires of big tensors, against the network's floor, in one run.

Two tensord nodes, each in a network namespace of its own joined by veth pairs to a bridge
(tests/cluster/netns_cluster.py: etcd, mutual TLS, UCX_TLS=tcp), and three ways to move
SIZE bytes from node a to node b:

  ucx_perftest   the floor: UCX's own benchmark of one-sided gets (ucp_get) and of tagged
                 messages (tag_bw) over the same transport and veth pair (Debian: ucx-utils)
  gRPC stream    a plain copy: a Python gRPC server in a's namespace streams SIZE bytes in
                 4 MiB messages to a client in b's (python3-grpcio)
  tensord        what a user writes: put(name, array) on a, then get(name) on b, timed as
                 the consumer sees it (the directory lookup, the owner's lease and
                 registration, the replica's memory on b, the gets over UCX): COUNT names
                 put once (every replica in new memory), and one name put COUNT times, as
                 weights are (b's released replica is recycled for the next generation)

Run as root from the repository root, after building tensord and the Python module:

  sudo TENSORD_BIN=build/server/tensord PYTHONPATH=build/python \\
      /usr/bin/python3 tests/bench/cluster_bench.py [--size-mib 64] [--count 8] [--json]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))

import netns_cluster  # noqa: E402
from netns_cluster import Cluster, digest, seeded  # noqa: E402

GRPC_PEER = r'''
import sys, time, grpc
from concurrent import futures
role, address, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
chunk = 4 << 20
identity = lambda b: b
if role == "server":
    payload = bytes(chunk)
    def stream(request, context):
        sent = 0
        while sent < size:
            n = min(chunk, size - sent)
            yield payload[:n]
            sent += n
    handler = grpc.method_handlers_generic_handler("bench.Copy", {
        "Stream": grpc.unary_stream_rpc_method_handler(stream, request_deserializer=identity,
                                                       response_serializer=identity)})
    server = grpc.server(futures.ThreadPoolExecutor(2), options=[("grpc.max_send_message_length", chunk + 1024)])
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(address)
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()
else:
    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", chunk + 1024)])
    grpc.channel_ready_future(channel).result(timeout=10)
    call = channel.unary_stream("/bench.Copy/Stream", request_serializer=identity, response_deserializer=identity)
    times = []
    for _ in range(int(sys.argv[4])):
        start = time.perf_counter()
        got = sum(len(m) for m in call(b""))
        times.append(time.perf_counter() - start)
        assert got == size, got
    print(" ".join(f"{t:.6f}" for t in times))
'''


def netns(node, *command, env=()):
    return ["ip", "netns", "exec", node.ns, "env", "UCX_TLS=tcp", "UCX_NET_DEVICES=eth0", *env, *command]


def ucx_perftest(a, b, test, size, iterations):
    """MB/s of UCX's own benchmark between a's and b's namespaces."""
    server = subprocess.Popen(netns(a, "ucx_perftest", "-p", "13337"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.0)
        out = subprocess.run(netns(b, "ucx_perftest", a.ip, "-p", "13337", "-t", test, "-s", str(size), "-n",
                                   str(iterations)), capture_output=True, text=True, timeout=300)
    finally:
        server.kill()
        server.wait()
    # The last numeric row: ... bandwidth (MB/s) average, overall ...; UCX's MB is 2^20 bytes.
    rows = [line.split() for line in out.stdout.splitlines() if re.match(r"^\s*Final:", line)]
    if not rows:
        raise RuntimeError(f"ucx_perftest {test}: no Final row:\n{out.stdout}\n{out.stderr}")
    mib_per_s = float(rows[-1][-4])  # the "bandwidth (MB/s) average" column
    return mib_per_s * (1 << 20) / 1e6


def grpc_stream(a, b, size, count):
    address = f"{a.ip}:23999"
    server = subprocess.Popen(netns(a, "/usr/bin/python3", "-c", GRPC_PEER, "server", address, str(size)),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        out = subprocess.run(netns(b, "/usr/bin/python3", "-c", GRPC_PEER, "client", address, str(size), str(count)),
                             capture_output=True, text=True, timeout=600, check=True)
    finally:
        server.kill()
        server.wait()
    times = [float(t) for t in out.stdout.split()]
    return size / statistics.median(times) / 1e6


def tensord_pulls(cluster, size, count):
    """The plain calls: put() on a, get() on b. Two patterns: COUNT names published once
    (each replica in new memory on b), and one name published COUNT times, as a trainer
    publishes weights (b's previous replica, released, is recycled for the next)."""
    import numpy as np
    import tensord
    a = cluster.nodes["a"].client()
    b = tensord.connect(socket=cluster.nodes["b"].socket, lease_cache=False)
    data = seeded(size, 21)
    for i in range(count):
        a.put(f"shared/bench/{i}", data)
    time.sleep(1.0)  # every publish recorded in the directory
    fresh = []
    for i in range(count):
        start = time.perf_counter()
        tensor = b.get(f"shared/bench/{i}", timeout=10)
        fresh.append(time.perf_counter() - start)
        if i == 0:
            assert digest(np.from_dlpack(tensor)) == digest(data)
        tensor.release()
    repeat = []
    for i in range(count):
        start = time.perf_counter()
        b.get(f"shared/bench/{i}").release()
        repeat.append(time.perf_counter() - start)
    generations = []
    for i in range(count + 1):
        a.put("shared/bench/weights", data)
        time.sleep(0.3)  # b's watch drops its replica of the previous generation
        start = time.perf_counter()
        tensor = b.get("shared/bench/weights", timeout=10)
        if i > 0:  # the first is a fresh replica, like the rows above
            generations.append(time.perf_counter() - start)
        tensor.release()
    b.close()
    return {
        "tensord_fresh_mb_s": size / statistics.median(fresh) / 1e6,
        "tensord_fresh_seconds": fresh,
        "tensord_generations_mb_s": size / statistics.median(generations) / 1e6,
        "tensord_generations_seconds": generations,
        "tensord_repeat_get_s": statistics.median(repeat),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    why = netns_cluster.missing()
    if why is None and shutil.which("ucx_perftest") is None:
        why = "needs ucx_perftest (Debian: ucx-utils)"
    if why is not None:
        sys.exit(f"cluster_bench: {why}")
    size = args.size_mib << 20
    cluster = Cluster(letters="ab")
    try:
        a, b = cluster.nodes["a"], cluster.nodes["b"]
        results = {
            "size_bytes": size,
            "ucx_perftest_get_mb_s": ucx_perftest(a, b, "ucp_get", size, 20),
            "ucx_perftest_tag_mb_s": ucx_perftest(a, b, "tag_bw", size, 20),
            "grpc_stream_mb_s": grpc_stream(a, b, size, args.count),
        }
        results.update(tensord_pulls(cluster, size, args.count))
    finally:
        cluster.close()
    floor = results["ucx_perftest_get_mb_s"]
    results["tensord_fresh_vs_floor"] = results["tensord_fresh_mb_s"] / floor
    results["tensord_generations_vs_floor"] = results["tensord_generations_mb_s"] / floor
    if args.json:
        print(json.dumps(results, indent=2))
        return
    mib = size >> 20

    def spread(key):
        times = results[key]
        return f"{min(times) * 1e3:.0f}-{max(times) * 1e3:.0f} ms"

    print(f"{mib} MiB from node a to node b over UCX TCP between two network namespaces (MB/s, 10^6 bytes/s)")
    print(f"  ucx_perftest ucp_get (floor)          {floor:6.0f}")
    print(f"  ucx_perftest tag_bw                   {results['ucx_perftest_tag_mb_s']:6.0f}")
    print(f"  gRPC stream (Python grpcio)           {results['grpc_stream_mb_s']:6.0f}")
    print(f"  get() on b, {args.count} names put once          {results['tensord_fresh_mb_s']:6.0f}   "
          f"{results['tensord_fresh_vs_floor']:.2f}x the floor (median; each {spread('tensord_fresh_seconds')})")
    print(f"  get() on b, one name put {args.count} times       {results['tensord_generations_mb_s']:6.0f}   "
          f"{results['tensord_generations_vs_floor']:.2f}x the floor (median; each "
          f"{spread('tensord_generations_seconds')})")
    print(f"  get() on b again (the replica is local) {results['tensord_repeat_get_s'] * 1e6:4.0f} us")


if __name__ == "__main__":
    main()
