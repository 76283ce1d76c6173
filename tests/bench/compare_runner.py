"""compare.py's processes: the daemon it starts on a private socket and the worker processes
of a run (peers.py), every one of them stopped in Runner.close(); and the CPU time of a
process. batch_pipeline.py and handoff_steps.py use them too, through compare.
"""

import multiprocessing
import os
import signal
import socket
import subprocess
import tempfile
import time

import peers

# ---- processes: everything started here is stopped in Runner.close() ----

def process_cpu(pid):
    """utime + stime of a live process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Runner:
    def __init__(self, args):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="tensord-compare-")
        self.popens = []
        self.workers = []
        self.ctx = multiprocessing.get_context("fork")
        self.socket = None
        self.run_id = 0

    def start_daemon(self):
        self.socket = os.path.join(self.dir, "tensord.sock")
        daemon = subprocess.Popen([self.args.tensord, "--socket", self.socket, "--log-level", "warn"],
                                  stdin=subprocess.DEVNULL)
        self.popens.append(daemon)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if daemon.poll() is not None:
                raise RuntimeError(f"tensord exited at start with status {daemon.returncode}")
            if os.path.exists(self.socket) and os.path.exists(self.socket + ".fd"):
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                try:
                    probe.connect(self.socket + ".fd")
                    return
                except OSError:
                    pass
                finally:
                    probe.close()
            time.sleep(0.01)
        raise RuntimeError(f"tensord did not start serving on {self.socket}")

    def run(self, workers, timeout=300):
        """workers: [(role, index, setup)]; returns the 'ok' result tuples."""
        barrier = self.ctx.Barrier(len(workers), timeout=120)
        results = self.ctx.Queue()
        procs = []
        for role, index, setup in workers:
            proc = self.ctx.Process(target=peers.run_worker, args=(results, barrier, role, index, setup),
                                    daemon=True)
            proc.start()
            procs.append(proc)
            self.workers.append(proc)
        got = []
        errors = []
        deadline = time.monotonic() + timeout
        try:
            while len(got) + len(errors) < len(workers):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"workers did not finish in {timeout} s")
                try:
                    result = results.get(timeout=min(left, 1.0))
                except Exception:  # queue.Empty; a worker that died without reporting
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead and not errors:
                        raise RuntimeError(f"a worker died with exit code {dead[0].exitcode}")
                    continue
                (errors if result[0] == "error" else got).append(result)
                if errors:
                    break
            if errors:
                raise RuntimeError("worker failed:\n" + "\n".join(f"{e[1]} {e[2]}:\n{e[3]}" for e in errors))
        finally:
            for proc in procs:
                proc.join(timeout=0 if errors else 10)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        return got

    def close(self):
        for proc in self.workers:
            if proc.is_alive():
                proc.kill()
                proc.join()
        for popen in reversed(self.popens):
            if popen.poll() is None:
                try:
                    os.killpg(popen.pid, signal.SIGTERM) if getattr(popen, "own_group", False) \
                        else popen.terminate()
                    popen.wait(timeout=10)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    pass
            if popen.poll() is None:
                if getattr(popen, "own_group", False):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.kill()
                popen.wait()
        subprocess.run(["rm", "-rf", self.dir], check=False)
