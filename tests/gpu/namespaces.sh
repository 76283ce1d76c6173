#!/usr/bin/env bash
# A CUDA tensor handed between two processes that share neither a PID nor an IPC namespace
# (as two containers without --pid=host or --ipc=host), through a daemon in a third: what
# Triton's CUDA shared memory and vLLM users cannot do, since pidfd_getfd needs a shared
# PID namespace. tensord passes the VMM allocation as a POSIX fd over its Unix socket.
#
#   tests/gpu/namespaces.sh PYTHON SOCKET    (run by tests/gpu/run-on-gpu.sh, as root)
#
# Two rounds, each a torch producer and a torch consumer started with `unshare --pid --ipc
# --mount --mount-proc --fork` (a /proc of their own PID namespace, as a container has; the
# CUDA driver's cuInit fails with CUDA_ERROR_OPERATING_SYSTEM under the machine's /proc):
#   nofence  the producer synchronizes and publishes with stream=-1 (no ready event): the
#            memory alone crosses; the consumer must read the producer's values
#   ordered  about 2 s of GPU work queued ahead of the producer's write, published with its
#            stream: the consumer's stream would wait on the producer's ready event. On an
#            H200 (docs/gpu-runs/2026-11-27-h200-71a1458) the consumer could not open it
#            (CUDA_ERROR_INVALID_CONTEXT): this round reports what happens and decides
#            nothing
# Each process prints its namespaces and its own pid (1 in a new PID namespace); the
# consumer prints whether it read the producer's values. Exits non-zero when the nofence
# round fails.
set -uo pipefail
[[ $# -eq 2 ]] || { sed -n 2,15p "$0"; exit 2; }
py=$1
export TENSORD_SOCKET=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap '' PIPE  # a producer that died leaves its fifo without a reader: say so below, do not die

cat >"$work/producer.py" <<'PY'
import os, sys, torch, tensord
name, mode = sys.argv[1], sys.argv[2]
print("producer pid", os.getpid(), "ns", os.readlink("/proc/self/ns/pid"), os.readlink("/proc/self/ns/ipc"), flush=True)
c = tensord.connect()
n = 1 << 22
t = c.empty((n,), "float32", device="cuda:0")
x = torch.from_dlpack(t)
values = torch.arange(n, device="cuda:0", dtype=torch.float32) + 3.0
x.zero_()
torch.cuda.synchronize()
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    if mode == "ordered":
        torch.cuda._sleep(4_000_000_000)  # about 2 s: a consumer that does not wait reads zeros
    x.copy_(values)
if mode == "nofence":
    s.synchronize()
c.publish(t, name, stream=-1 if mode == "nofence" else s.cuda_stream)
print("published", mode, "pending", not s.query(), flush=True)
sys.stdin.readline()  # stays (and its ready event with it) until the consumer is done
PY

cat >"$work/consumer.py" <<'PY'
import os, sys, torch, tensord
print("consumer pid", os.getpid(), "ns", os.readlink("/proc/self/ns/pid"), os.readlink("/proc/self/ns/ipc"), flush=True)
c = tensord.connect()
s = torch.cuda.Stream()
expected = torch.arange(1 << 22, device="cuda:0", dtype=torch.float32) + 3.0
with torch.cuda.stream(s):
    (expected == expected).all()  # kernels loaded before the read: a lazy load synchronizes
torch.cuda.synchronize()
print("ready", flush=True)
t = c.get(sys.argv[1], timeout=120)
with torch.cuda.stream(s):
    x = torch.from_dlpack(t)  # s waits for the producer's ready event
    same = (x == expected).all()
pending = not s.query()
print("consumer values", bool(same), "was pending", pending, flush=True)
PY

echo "script pid ns $(readlink /proc/self/ns/pid) ipc ns $(readlink /proc/self/ns/ipc)"
isolated=(unshare --pid --ipc --mount --mount-proc --fork --kill-child)
wait_for_line() {  # wait_for_line FILE PREFIX PID: until FILE has a line starting with PREFIX (120 s)
  for _ in $(seq 1200); do
    grep -q "^$2" "$1" && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
status=0
for mode in nofence ordered; do
  echo "=== $mode"
  # The consumer first, waiting for the name (its CUDA start-up is over before the publish).
  timeout 180 "${isolated[@]}" "$py" "$work/consumer.py" "ns/$mode" >"$work/consumer.$mode" 2>&1 &
  consumer=$!
  wait_for_line "$work/consumer.$mode" ready "$consumer" || echo "the consumer did not get ready"
  fifo=$work/in.$mode
  mkfifo "$fifo"
  "${isolated[@]}" "$py" "$work/producer.py" "ns/$mode" "$mode" <"$fifo" >"$work/producer.$mode" 2>&1 &
  producer=$!
  exec 3>"$fifo"
  wait "$consumer"
  echo "consumer exit $?"
  echo >&3 2>/dev/null
  exec 3>&-
  wait "$producer"
  echo "producer exit $?"
  cat "$work/producer.$mode" "$work/consumer.$mode"
  if [[ $mode == nofence ]]; then
    grep -q "^consumer values True" "$work/consumer.$mode" || status=1
  fi
done
exit $status
