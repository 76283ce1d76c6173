#!/usr/bin/env python3
"""deploy/systemd's units under a real systemd: PID 1 of a Debian 12 container.

The image (systemd.Dockerfile) holds `cmake --install` of the build under /usr/local and
systemd. This program boots it, installs the units with the commands of docs/deployment.md
(its systemd section's sh block, run as root), and checks, with systemd's own view printed
(`systemctl status`, `systemctl show`, the journal):

- socket activation: after `enable --now` of the sockets the service is inactive; the first
  client starts it, and systemd made the sockets (mode, group); /run/tensord stays root's
  and a member of group tensord is served;
- Type=notify: the service is active with the daemon's STATUS= line as its status text;
- the watchdog: WatchdogUSec is 30 s and the keep-alive timestamp advances; a daemon that
  hangs (SIGSTOP) is killed by the watchdog and restarted, its named tensors kept;
- the fd store: a named tensor published, the daemon killed with kill -9, systemd restarts
  it, and the tensor is there with the same bytes and generation;
- `systemctl reload` is refused (the unit has no ExecReload); `systemctl restart` keeps the
  fd store, so the named tensor is still there;
- `systemctl stop` ends the daemon with status 0, empties the fd store and stops the sockets
  (PartOf=); with the sockets started again, the next client starts an empty daemon.

Usage: systemd_units.py --docker PATH --image TAG --docs docs/deployment.md
"""

import argparse
import re
import subprocess
import time

from live_common import expect, json_line, log, main_guard, run, wait_for

CONTAINER = "tensord-deploy-systemd"
SOCKET = "/run/tensord/tensord.sock"
# What systemd needs of its container on this engine: its own cgroup hierarchy, writable;
# tmpfs on /run and /run/lock; the mount, namespace and kill capabilities its units'
# sandboxing uses (ProtectSystem=, PrivateTmp=, ...). `--privileged` grants these and more;
# an engine that may not grant every capability (CAP_SYS_RESOURCE missing, as on the
# project's machines) fails it, so the capabilities are listed one by one.
CAPABILITIES = [
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID",
    "SETUID", "SETPCAP", "NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW", "IPC_LOCK",
    "SYS_CHROOT", "SYS_PTRACE", "SYS_ADMIN", "SYS_NICE", "MKNOD", "AUDIT_WRITE",
    "AUDIT_CONTROL", "SETFCAP", "SYSLOG",
]


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--docker", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--docs", required=True, help="docs/deployment.md")
    return parser.parse_args()


class Machine:
    """The systemd container: commands run in it as root."""

    def __init__(self, docker):
        self.docker = docker

    def sh(self, script, check=True, quiet=False):
        return run([self.docker, "exec", CONTAINER, "bash", "-c", script], check=check,
                   quiet=quiet)

    def show(self, unit, prop):
        return self.sh(f"systemctl show -P {prop} {unit}", quiet=True)

    def peer(self, *args, check=True):
        return self.sh("python3 /opt/tensord-test/tensor_peer.py " + " ".join(map(str, args)),
                       check=check)

    def status(self):
        self.sh("systemctl status --no-pager -l tensord.service tensord.socket "
                "tensord-fd.socket", check=False)


def install_commands(docs):
    """The sh block after "To install them" in docs/deployment.md, one command per entry,
    `sudo ` dropped (the commands run as root), the final `systemctl status` left to the
    checks (it exits 3 while the service is not started, which is expected here)."""
    text = open(docs).read()
    at = text.index("To install them on a machine where `tensord` was installed by")
    block = re.search(r"```sh\n(.*?)```", text[at:], re.S).group(1)
    block = block.replace("\\\n", " ")
    commands = []
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("systemctl status"):
            continue
        commands.append(re.sub(r"^sudo ", "", line))
    return commands


def wait_active(machine, what):
    _, waited = wait_for(what, lambda: machine.show("tensord.service", "ActiveState")
                         == "active", timeout=30)
    return waited


def main_pid(machine):
    return int(machine.show("tensord.service", "MainPID"))


def signal_and_await_restart(machine, signal, what, timeout):
    """Sends the daemon a signal and waits for systemd to have restarted it (a new main pid,
    NRestarts up by one or more); returns (old pid, new pid, seconds waited)."""
    old_pid = main_pid(machine)
    restarts_before = int(machine.show("tensord.service", "NRestarts"))
    machine.sh(f"kill -{signal} {old_pid}")

    def restarted():
        pid = main_pid(machine)
        return (machine.show("tensord.service", "ActiveState") == "active" and pid not in
                (0, old_pid) and int(machine.show("tensord.service", "NRestarts"))
                > restarts_before) and pid
    new_pid, waited = wait_for(what, restarted, timeout=timeout, interval=1.0)
    return old_pid, new_pid, waited


def boot(docker, image):
    subprocess.run([docker, "rm", "-f", CONTAINER], capture_output=True)
    cmd = [docker, "run", "-d", "--name", CONTAINER, "--cgroupns=host",
           "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
           "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
           "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined"]
    for cap in CAPABILITIES:
        cmd += ["--cap-add", cap]
    run(cmd + [image])
    machine = Machine(docker)
    _, waited = wait_for(
        "systemd in the container reaching running or degraded",
        lambda: machine.sh("systemctl is-system-running || true", quiet=True)
        in ("running", "degraded"), timeout=60)
    log(f"systemd is up {waited:.1f} s after `docker run`")
    machine.sh("ps -o pid,comm -p 1; systemctl --version | head -1; "
               "systemctl --failed --no-pager", check=False)
    return machine


def body():
    args = parse_args()
    machine = boot(args.docker, args.image)
    try:
        checks(machine, args.docs)
    finally:
        log("--- systemd's view at the end")
        machine.status()
        machine.sh("journalctl --no-pager -o short-monotonic -u tensord.service "
                   "-u tensord.socket -u tensord-fd.socket", check=False)
        subprocess.run([args.docker, "rm", "-f", CONTAINER], capture_output=True)


def checks(machine, docs):
    log("--- the operator's install, as docs/deployment.md writes it")
    for command in install_commands(docs):
        machine.sh(f"cd /opt/tensord-src && {command}")

    log("--- socket activation")
    expect(machine.show("tensord.service", "ActiveState") == "inactive",
           "tensord.service inactive after `enable --now` of its sockets",
           machine.show("tensord.service", "ActiveState"))
    for unit in ("tensord.socket", "tensord-fd.socket"):
        expect(machine.show(unit, "ActiveState") == "active", f"{unit} listening",
               machine.show(unit, "ActiveState"))
    listing = machine.sh("stat -c '%A %U:%G %n' /run/tensord /run/tensord/*")
    expect("srw-rw---- root:tensord /run/tensord/tensord.sock" in listing,
           "systemd made the gRPC socket, mode 0660, group tensord", listing)
    expect("srw-rw---- root:tensord /run/tensord/tensord.sock.fd" in listing,
           "systemd made the fd channel, mode 0660, group tensord", listing)
    health = machine.sh(f"tensorctl health --socket {SOCKET}")
    expect(health == "SERVING", "the first client (tensorctl health) is answered SERVING",
           health)
    waited = wait_active(machine, "tensord.service active after the first client")
    log(f"tensord.service active {waited:.1f} s after the health answer")

    log("--- Type=notify readiness and the watchdog")
    props = {p: machine.show("tensord.service", p) for p in
             ("Type", "NotifyAccess", "WatchdogUSec", "StatusText", "User", "MainPID",
              "ExecMainStartTimestamp", "WatchdogTimestamp")}
    log(f"systemctl show tensord.service: {props}")
    expect(props["Type"] == "notify", "Type=notify", props["Type"])
    expect(props["StatusText"].startswith("serving"),
           "the daemon's STATUS= line is systemd's status text", props["StatusText"])
    expect(props["WatchdogUSec"] == "30s", "WatchdogUSec 30s", props["WatchdogUSec"])
    expect(props["User"] == "tensord", "the daemon runs as user tensord", props["User"])
    owner = machine.sh(f"ps -o user= -p {props['MainPID']}")
    expect(owner == "tensord", "its main process belongs to tensord", owner)
    # LimitNOFILE=1048576, capped by the container's own hard limit where that is lower.
    machine.sh(f"grep 'open files' /proc/{props['MainPID']}/limits; ulimit -Hn")
    directory = machine.sh("stat -c '%A %U:%G' /run/tensord")
    expect(directory == "drwxr-xr-x root:root", "/run/tensord stays root's, mode 0755, "
           "with the daemon running (clients refuse a directory of an untrusted uid)",
           directory)
    machine.sh("useradd --create-home --groups tensord operator-alice")
    answer = machine.sh(f"runuser -u operator-alice -- tensorctl status --socket {SOCKET}")
    expect("broker" in answer, "a user in group tensord (not root) is served", answer)
    first = machine.show("tensord.service", "WatchdogTimestampMonotonic")
    later, waited = wait_for(
        "a new watchdog keep-alive within 20 s (they come every 15 s)",
        lambda: (lambda now: now != first and now)(
            machine.show("tensord.service", "WatchdogTimestampMonotonic")),
        timeout=20, interval=1.0)
    log(f"ok: watchdog keep-alive seen: WatchdogTimestampMonotonic {first} -> {later} "
        f"(waited {waited:.1f} s)")

    log("--- the fd store across kill -9")
    published = json_line(machine.peer("publish", "deploy/kept", 8 << 20, 11),
                          "the publisher")
    time.sleep(2)  # the daemon stores changed names every 500 ms
    stored = machine.show("tensord.service", "NFileDescriptorStore")
    log(f"fds in systemd's store: {stored}")
    expect(int(stored) >= 2, "the buffer and the registry are in the fd store", stored)
    pid, new_pid, waited = signal_and_await_restart(
        machine, "KILL", "systemd restarting the daemon after kill -9", 30)
    log(f"ok: systemd restarted the daemon {waited:.1f} s after kill -9 (pid {pid} -> "
        f"{new_pid})")
    machine.peer("expect", "deploy/kept", published["sha256"], published["generation"])
    log(f"ok: deploy/kept survived kill -9 with sha256 {published['sha256'][:16]}... and "
        f"generation {published['generation']}")

    log("--- a hung daemon: the watchdog kills it, Restart=on-failure starts it again")
    pid, new_pid, waited = signal_and_await_restart(
        machine, "STOP", "the watchdog restarting a stopped daemon", 75)
    log(f"ok: the watchdog restarted the stopped daemon {waited:.1f} s after SIGSTOP "
        f"(pid {pid} -> {new_pid})")
    journal = machine.sh("journalctl --no-pager -u tensord.service -g 'Watchdog timeout'",
                         check=False)
    expect("Watchdog timeout" in journal, "the journal says the watchdog timed out", journal)
    machine.peer("expect", "deploy/kept", published["sha256"], published["generation"])
    log("ok: deploy/kept survived the watchdog's restart too")

    log("--- systemctl reload and restart, as documented")
    reload = subprocess.run([machine.docker, "exec", CONTAINER, "systemctl", "reload",
                             "tensord.service"], capture_output=True, text=True)
    log(f"$ systemctl reload tensord.service -> exit {reload.returncode}: "
        f"{reload.stderr.strip()}")
    expect(reload.returncode != 0 and "not applicable" in reload.stderr,
           "`systemctl reload` refused: the unit has no ExecReload", reload.stderr.strip())
    pid = main_pid(machine)
    machine.sh("systemctl restart tensord.service")
    expect(main_pid(machine) != pid, "`systemctl restart` started a new daemon",
           f"pid {main_pid(machine)}")
    machine.peer("expect", "deploy/kept", published["sha256"], published["generation"])
    log("ok: `systemctl restart` keeps the fd store: deploy/kept is there with the same "
        "bytes and generation")

    log("--- systemctl stop: the sockets stop too (PartOf=) and the fd store is emptied")
    machine.sh("systemctl stop tensord.service")
    code = machine.show("tensord.service", "ExecMainStatus")
    expect(code == "0", "`systemctl stop` ends the daemon with status 0", code)
    stored = machine.show("tensord.service", "NFileDescriptorStore")
    expect(stored == "0", "the fd store is empty once the service stopped", stored)
    for unit in ("tensord.socket", "tensord-fd.socket"):
        state = machine.show(unit, "ActiveState")
        expect(state == "inactive", f"{unit} stopped with the service (PartOf=)", state)
    machine.sh("systemctl start tensord.socket tensord-fd.socket")
    expect(machine.show("tensord.service", "ActiveState") == "inactive",
           "starting the sockets again does not start the daemon",
           machine.show("tensord.service", "ActiveState"))
    machine.peer("absent", "deploy/kept")
    wait_active(machine, "the next client starting the daemon again")
    log("ok: the next client started the daemon through its socket, and it started empty")

if __name__ == "__main__":
    main_guard(body)
