"""What the daemon itself costs on the GPU: its processes in nvidia-smi before any device
tensor, with a 1 GiB one, and after it is gone (the daemon makes no CUDA context).

    python3 tests/gpu/daemon_gpu_memory.py path/to/tensord   (run by tests/gpu/run-on-gpu.sh)
"""
import atexit, os, subprocess, sys, tempfile, time
import tensord
d = tempfile.mkdtemp()
sock = os.path.join(d, "t.sock")
daemon = subprocess.Popen([sys.argv[1], "--socket", sock, "--log-level", "info"])
atexit.register(lambda: daemon.poll() is None and daemon.kill())  # also when a step below fails
def apps(when):
    q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
                       capture_output=True, text=True).stdout
    print(f"-- {when} (daemon pid {daemon.pid})\n{q}", flush=True)
for _ in range(200):
    if os.path.exists(sock + ".fd"):
        break
    time.sleep(0.05)
time.sleep(0.5)
c = tensord.connect(sock)
apps("daemon started, no device tensor")
t = c.empty((256 << 20,), "float32", device="cuda:0")  # 1 GiB
c.publish(t, "m/one")
t.release()
apps("one 1 GiB device tensor published (this client holds a mapping of it)")
print([b for b in c.status()["backends"] if b["name"] == "cuda"])
c.delete("m/one")
c.flush()
time.sleep(0.5)
apps("deleted")
c.close()
daemon.terminate()
daemon.wait()
