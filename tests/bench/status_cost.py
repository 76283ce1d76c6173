"""What Status costs as the tensors grow, and what it does to everyone else meanwhile.

    build/server/tensord --socket /tmp/s/t.sock &
    PYTHONPATH=build/python /usr/bin/python3 tests/bench/status_cost.py /tmp/s/t.sock 100000

Publishes N zero-byte tensors in one namespace (put_many, 4096 at a time), then prints the
latency of status(sessions=True) (50 calls), and another client's get of a small tensor
(no lease cache: each get a round trip) for 5 s while 4 threads loop status(sessions=True).
Run it once with 0 and once with N on fresh daemons to compare (docs/reliability.md).
"""

import statistics
import sys
import threading
import time

import numpy as np

import tensord


def main():
    socket, count = sys.argv[1], int(sys.argv[2])
    client = tensord.connect(socket)
    client.put("probe/x", np.zeros(4, dtype=np.float32))
    for start in range(0, count, 4096):
        client.put_many({f"many/t{i:07d}": np.zeros(0, dtype=np.float32)
                         for i in range(start, min(count, start + 4096))})
    times = []
    for _ in range(50):
        begin = time.perf_counter()
        client.status(sessions=True)
        times.append(time.perf_counter() - begin)
    print(f"{count} tensors: status p50 {statistics.median(times) * 1e3:.2f} ms, max {max(times) * 1e3:.2f} ms")

    stop = threading.Event()

    def loop():
        looper = tensord.connect(socket)
        while not stop.is_set():
            looper.status(sessions=True)

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for t in threads:
        t.start()
    other = tensord.connect(socket, lease_cache=False)
    latencies = []
    end = time.time() + 5
    while time.time() < end:
        begin = time.perf_counter()
        other.get("probe/x").release()
        latencies.append(time.perf_counter() - begin)
    stop.set()
    for t in threads:
        t.join()
    latencies.sort()
    print(f"{count} tensors: another client's get while 4 threads loop status: p50 "
          f"{statistics.median(latencies) * 1e3:.2f} ms, p99 {latencies[int(len(latencies) * 0.99)] * 1e3:.2f} ms, "
          f"max {latencies[-1] * 1e3:.2f} ms ({len(latencies)} gets)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
