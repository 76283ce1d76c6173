"""tensord under systemd's protocols, with this test as the service manager.

The harness does what systemd does for deploy/systemd's units: it binds and listens on the
two sockets itself, passes them to the daemon as fds 3 and 4 with LISTEN_FDS, LISTEN_PID
and LISTEN_FDNAMES (sd_listen_fds(3)), and listens on a NOTIFY_SOCKET datagram socket for
READY=1, STATUS=, WATCHDOG=1 and STOPPING=1 (sd_notify(3)). It keeps a file-descriptor
store as systemd does (FDSTORE=1 and FDSTOREREMOVE=1 with their fds) and passes the stored
fds back, with their names, when it starts the daemon again. The units themselves are checked
with `systemd-analyze verify`; no test starts them under a real systemd (the project's
machines have none as PID 1).

Environment: TENSORD_BIN (the daemon), TENSORCTL_BIN (the CLI), TENSORD_UNITS_DIR
(deploy/systemd). ctest sets all three (tests/service/CMakeLists.txt).
"""

import array
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

TENSORD = os.environ.get("TENSORD_BIN", "")
TENSORCTL = os.environ.get("TENSORCTL_BIN", "")
UNITS = os.environ.get("TENSORD_UNITS_DIR", "")


def listening(path, kind):
    s = socket.socket(socket.AF_UNIX, kind)
    s.bind(path)
    os.chmod(path, 0o660)
    s.listen(64)
    return s


class Manager:
    """The service manager's side: the sockets, the notify socket, the daemon process."""

    def __init__(self, directory):
        self.dir = directory
        self.socket_path = os.path.join(directory, "t.sock")
        self.grpc = listening(self.socket_path, socket.SOCK_STREAM)
        self.fd_channel = listening(self.socket_path + ".fd", socket.SOCK_SEQPACKET)
        self.notify_path = os.path.join(directory, "notify")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.proc = None
        self.log_path = os.path.join(directory, "tensord.log")
        self.store = {}  # the fd store: name -> [fd, ...], as FDSTORE=1 / FDSTOREREMOVE=1 leave it

    def start(self, fds=None, names="grpc:fd-channel", args=(), env=None):
        """Starts tensord with `fds` (default: both sockets, then the fd store's fds under
        their names, as systemd passes them) as fds 3, 4, ..."""
        if fds is None:
            fds = [self.grpc, self.fd_channel]
            for name, stored in sorted(self.store.items()):
                fds += stored
                names += ":" + ":".join([name] * len(stored))
        numbers = [f if isinstance(f, int) else f.fileno() for f in fds]
        environment = dict(os.environ)
        environment.update({"LISTEN_FDS": str(len(numbers)), "NOTIFY_SOCKET": self.notify_path})
        if names is not None:
            environment["LISTEN_FDNAMES"] = names
        environment.update(env or {})

        def place_fds():
            # Up out of the way first, so no target number is overwritten before it is moved.
            high = [os.dup2(n, 100 + i) for i, n in enumerate(numbers)]
            for i, h in enumerate(high):
                os.dup2(h, 3 + i)

        log = open(self.log_path, "ab")
        # LISTEN_PID must be the daemon's own pid: the shell sets it to its pid, then becomes
        # the daemon with exec.
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"', TENSORD, *args],
            env=environment,
            preexec_fn=place_fds,
            pass_fds=list(range(3, 3 + len(numbers))),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        return self.proc

    def messages(self, until, timeout=20):
        """Notify datagrams (as dicts) up to and including the first that has key `until`."""
        got = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {until}= from tensord within {timeout} s; got {got}; log: {self.log()}")
            self.notify.settimeout(left)
            try:
                fields = self.receive()
            except socket.timeout:
                continue
            got.append(fields)
            if until in fields:
                return got

    def receive(self):
        """One notification; FDSTORE=1 and FDSTOREREMOVE=1 change self.store as systemd does."""
        data, ancdata, _, _ = self.notify.recvmsg(4096, socket.CMSG_SPACE(64 * 4))
        fds = []
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += array.array("i", payload[: len(payload) - len(payload) % 4]).tolist()
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        name = fields.get("FDNAME", "stored")
        if fields.get("FDSTORE") == "1":
            self.store.setdefault(name, []).extend(fds)
        else:
            for fd in fds:
                os.close(fd)
        if fields.get("FDSTOREREMOVE") == "1":
            for fd in self.store.pop(name, []):
                os.close(fd)
        return fields

    def drain(self, seconds):
        """Takes every notification for `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.notify.settimeout(left)
            try:
                self.receive()
            except socket.timeout:
                pass

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.grpc.close()
        self.fd_channel.close()
        self.notify.close()
        for fds in self.store.values():
            for fd in fds:
                os.close(fd)


@pytest.fixture
def manager(tmp_path):
    m = Manager(str(tmp_path))
    yield m
    m.close()


def tensorctl(socket_path, *args, check=True, timeout=30):
    result = subprocess.run([TENSORCTL, "--socket", socket_path, *args], capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"tensorctl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


def put_array(manager, name, values):
    np = pytest.importorskip("numpy")
    path = os.path.join(manager.dir, name.replace("/", "_") + ".npy")
    np.save(path, np.asarray(values, dtype=np.float32))
    tensorctl(manager.socket_path, "put", name, path)


def get_array(manager, name):
    np = pytest.importorskip("numpy")
    path = os.path.join(manager.dir, "out.npy")
    tensorctl(manager.socket_path, "get", name, "-o", path)
    return np.load(path).tolist()


def test_serves_on_passed_sockets_and_says_ready(manager):
    manager.start()
    ready = manager.messages("READY")[-1]
    assert ready["READY"] == "1"
    assert "serving 0 tensors" in ready["STATUS"], ready
    put_array(manager, "svc/a", [1.0, 2.0, 3.0])
    assert get_array(manager, "svc/a") == [1.0, 2.0, 3.0]
    status = json.loads(tensorctl(manager.socket_path, "status", "--json").stdout)
    assert status["socket"] == manager.socket_path
    assert "socket activation" in manager.log()

    manager.proc.send_signal(signal.SIGTERM)
    stopping = manager.messages("STOPPING")[-1]
    assert stopping["STOPPING"] == "1" and "draining" in stopping["STATUS"], stopping
    assert manager.proc.wait(timeout=20) == 0
    # The sockets are the manager's: they stay for the next start.
    assert os.path.exists(manager.socket_path) and os.path.exists(manager.socket_path + ".fd")


def test_watchdog_keep_alives_and_status_lines(manager):
    # WatchdogSec=400ms: a keep-alive every 200 ms, each with the broker's status.
    manager.start(env={"WATCHDOG_USEC": "400000"})
    manager.messages("READY")
    put_array(manager, "svc/w", [5.0])
    beats = []
    deadline = time.monotonic() + 10
    while len(beats) < 3 and time.monotonic() < deadline:
        beats += [m for m in manager.messages("WATCHDOG", timeout=5) if "WATCHDOG" in m]
    assert len(beats) >= 3, beats
    assert all(b["WATCHDOG"] == "1" for b in beats)
    assert "serving 1 tensors (1 named)" in beats[-1]["STATUS"], beats[-1]
    assert "a keep-alive every 200 ms" in manager.log()


def test_restart_on_the_same_sockets_serves_waiting_clients(manager):
    # What Restart=on-failure does: the daemon dies (kill -9), the manager keeps the sockets
    # and starts a new one; a client that connected in between waits in the backlog.
    manager.start()
    manager.messages("READY")
    put_array(manager, "svc/r", [1.0])
    manager.proc.kill()
    manager.proc.wait()
    waiting = subprocess.Popen([TENSORCTL, "--socket", manager.socket_path, "status", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    assert waiting.poll() is None, "the client should wait in the backlog while no daemon runs"
    manager.start()
    manager.messages("READY")
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err
    assert json.loads(out)["named_tensors"] == 0  # names do not survive a crash yet
    put_array(manager, "svc/r", [2.0])
    assert get_array(manager, "svc/r") == [2.0]


def test_unnamed_sockets_are_told_apart_by_type(manager):
    # systemd-socket-activate and units without FileDescriptorName= pass "unknown" names.
    manager.start(fds=[manager.fd_channel, manager.grpc], names=None)
    manager.messages("READY")
    put_array(manager, "svc/u", [3.0])
    assert get_array(manager, "svc/u") == [3.0]


def refused(manager, **kwargs):
    proc = manager.start(**kwargs)
    assert proc.wait(timeout=20) != 0
    return manager.log()


def test_only_one_socket_is_refused(manager):
    log = refused(manager, fds=[manager.grpc], names="grpc")
    assert "no 'fd-channel' socket" in log, log


def test_an_unknown_name_is_refused(manager):
    log = refused(manager, names="grpc:metrics")
    assert "fd 4 ('metrics') has a name tensord does not know" in log, log


def test_a_socket_of_the_wrong_type_is_refused(manager, tmp_path):
    other = listening(str(tmp_path / "other.sock"), socket.SOCK_STREAM)
    try:
        log = refused(manager, fds=[manager.grpc, other], names="grpc:fd-channel")
    finally:
        other.close()
    assert "'fd-channel' socket must be SOCK_SEQPACKET" in log, log


def test_a_different_socket_setting_is_refused(manager, tmp_path):
    log = refused(manager, args=["--socket", str(tmp_path / "elsewhere.sock")])
    assert f"bound to {manager.socket_path} but the socket setting (--socket) names" in log, log


def test_units_pass_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    names = ["tensord.socket", "tensord-fd.socket", "tensord.service"]
    for name in names:
        text = open(os.path.join(UNITS, name)).read()
        # ExecStart must name a binary that exists: the one this build made.
        text = text.replace("/usr/local/bin/tensord", os.path.abspath(TENSORD))
        (tmp_path / name).write_text(text)
    result = subprocess.run([analyze, "verify", "--man=no", *[str(tmp_path / n) for n in names]],
                            capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys and bad values, which it only prints: any output fails.
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.returncode, result.stdout, result.stderr)
    service = open(os.path.join(UNITS, "tensord.service")).read()
    # No RuntimeDirectory=: systemd would chown /run/tensord to the daemon's user, and clients
    # refuse a socket directory of a uid they do not trust (it ran so under systemd).
    directives = [line for line in service.splitlines() if not line.startswith("#")]
    assert not [line for line in directives if line.startswith("RuntimeDirectory")], directives
    for line in ["Type=notify", "WatchdogSec=", "Sockets=tensord.socket tensord-fd.socket", "User=tensord",
                 "ExecStartPre=+", "ReadWritePaths=/run/tensord", "LimitNOFILE=",
                 "FileDescriptorStoreMax=", "Environment=TENSORD_FD_STORE=on"]:
        assert line in service, line
    assert "FileDescriptorName=grpc" in open(os.path.join(UNITS, "tensord.socket")).read()
    assert "FileDescriptorName=fd-channel" in open(os.path.join(UNITS, "tensord-fd.socket")).read()


def test_example_config_is_accepted(tmp_path):
    result = subprocess.run([TENSORD, "--config", os.path.join(UNITS, "tensord.toml"), "--print-config"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert 'socket = "/run/tensord/tensord.sock"' in result.stdout


def stored_buffers(manager):
    return sorted(n for n in manager.store if n.startswith("b"))


def test_fd_store_keeps_named_tensors_across_a_kill_9(manager):
    on = {"TENSORD_FD_STORE": "on"}
    manager.start(env=on)
    manager.messages("READY")
    put_array(manager, "keep/a", [1.0, 2.0, 3.0])
    put_array(manager, "keep/a", [4.0, 5.0, 6.0])  # generation 2
    put_array(manager, "keep/gone", [7.0])
    tensorctl(manager.socket_path, "rm", "keep/gone")
    manager.drain(1.5)  # three sync periods
    assert {"registry-a", "registry-b"} & set(manager.store), manager.store
    assert len([n for n in manager.store if n.startswith("registry")]) == 1
    manager.proc.kill()  # a crash: no drain, no goodbye
    manager.proc.wait()

    manager.start(env=on)
    manager.messages("READY")
    assert "restored 1 named tensors" in manager.log(), manager.log()
    assert get_array(manager, "keep/a") == [4.0, 5.0, 6.0]
    stat = json.loads(tensorctl(manager.socket_path, "stat", "keep/a", "--json").stdout)
    assert stat["generation"] == 2
    assert tensorctl(manager.socket_path, "stat", "keep/gone", check=False).returncode != 0
    # The store now holds this daemon's own state: one registry, the one buffer it needs.
    manager.drain(1.5)
    assert len([n for n in manager.store if n.startswith("registry")]) == 1, manager.store
    assert len(stored_buffers(manager)) == 1, manager.store
    put_array(manager, "keep/a", [9.0])  # generations go on after keep/gone's 3
    stat = json.loads(tensorctl(manager.socket_path, "stat", "keep/a", "--json").stdout)
    assert stat["generation"] == 4


def test_a_corrupt_stored_registry_starts_empty_saying_why(manager):
    on = {"TENSORD_FD_STORE": "on"}
    manager.start(env=on)
    manager.messages("READY")
    put_array(manager, "keep/a", [1.0])
    manager.drain(1.5)
    manager.proc.kill()
    manager.proc.wait()
    name = [n for n in manager.store if n.startswith("registry")][0]
    bad = os.memfd_create("bad", os.MFD_ALLOW_SEALING)
    os.write(bad, b"TNSDSNAP" + b"\x01" + b"\x00" * 40)
    fcntl.fcntl(bad, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    for fd in manager.store[name]:
        os.close(fd)
    manager.store[name] = [bad]
    manager.start(env=on)
    manager.messages("READY")
    assert "the fd store's registry cannot be used" in manager.log(), manager.log()
    assert json.loads(tensorctl(manager.socket_path, "status", "--json").stdout)["named_tensors"] == 0
    manager.drain(1.5)  # the passed names are removed, the daemon's own stored
    assert stored_buffers(manager) == [], manager.store


def test_a_bad_fd_store_setting_is_refused():
    result = subprocess.run([TENSORD, "--fd-store", "maybe", "--print-config"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2 and "--fd-store 'maybe': must be on or off" in result.stderr, result.stderr
