#!/usr/bin/env python3
"""The images of deploy/docker run on a real Docker engine: a daemon container, client
containers and a client on the host share one tensor.

- The daemon container runs as the Dockerfile and docs/deployment.md say (read-only root,
  every capability dropped, no-new-privileges, the socket on a named volume) and its
  HEALTHCHECK must turn healthy.
- A client container publishes 64 MiB of seeded random bytes; a second client container and
  a client on the host (the build's Python module, through the volume's directory) get it
  and must see the same bytes and generation.
- Zero copy: both readers must map the same memfd (same device and inode in /proc/PID/maps)
  and the same physical pages (same frame numbers in /proc/PID/pagemap, read as root).
- `docker stop` must end the daemon with exit status 0 inside its grace period.

Usage: containers.py --docker PATH --live-dir DIR --python-path DIR
"""

import argparse
import os
import subprocess
import time

from live_common import Failed, expect, json_line, log, main_guard, run, wait_for
import pages

DAEMON = "tensord-deploy-daemon"
READER = "tensord-deploy-reader"
VOLUME = "tensord-deploy-socket"
NAME = "deploy/shared"
NBYTES = 64 << 20
HARDENED = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true"]


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--docker", required=True)
    parser.add_argument("--live-dir", required=True, help="this folder, mounted into clients")
    parser.add_argument("--python-path", required=True, help="the host's tensord module")
    return parser.parse_args()


def cleanup(docker):
    for container in (READER, DAEMON):
        subprocess.run([docker, "rm", "-f", container], capture_output=True)
    subprocess.run([docker, "volume", "rm", "-f", VOLUME], capture_output=True)


def client_container(docker, live_dir, *args, interactive=False, name=None):
    cmd = [docker, "run", "--rm"] + HARDENED
    if interactive:
        cmd.append("-i")
    if name:
        cmd += ["--name", name]
    cmd += ["-v", f"{VOLUME}:/run/tensord:ro", "-v", f"{live_dir}:/opt/tensord-test:ro",
            "-e", "TENSORD_SOCKET=/run/tensord/tensord.sock",
            "tensord-client:0.1.0", "python3", "/opt/tensord-test/tensor_peer.py", *args]
    return cmd


def start_holder(cmd, source, env=None):
    log("$ " + " ".join(cmd) + "   (holds the tensor until told)")
    process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    line = process.stdout.readline()
    if not line:
        raise Failed(f"{source} ended before reporting: {process.stderr.read()}")
    facts = json_line(line, source)
    log(f"{source}: {facts}")
    return process, facts


def finish_holder(process, source):
    process.stdin.write("done\n")
    process.stdin.flush()
    rc = process.wait(timeout=30)
    expect(rc == 0, f"{source} released the tensor and exited 0", f"exit {rc}: "
           f"{process.stderr.read()}")


def compare_pages(holders):
    """holders: [(label, host pid, facts)]; each maps the same memfd and page frames."""
    seen = []
    for label, pid, facts in holders:
        mapping = pages.mapping_at(pid, facts["address"])
        frames = pages.frames(pid, facts["address"], facts["nbytes"])
        missing = sum(f is None for f in frames)
        log(f"{label} (host pid {pid}): {mapping}; {len(frames)} pages, {missing} not present")
        expect(mapping.path.startswith("/memfd:"), f"{label} maps a memfd",
               mapping.path or "an anonymous mapping")
        expect(missing == 0, f"every page of the tensor is present in {label}",
               f"{missing} missing")
        seen.append((label, mapping, frames))
    (first, first_map, first_frames), others = seen[0], seen[1:]
    for label, mapping, frames in others:
        expect((mapping.device, mapping.inode) == (first_map.device, first_map.inode),
               f"{label} and {first} map the same file (dev, inode)",
               f"{mapping.device}:{mapping.inode} against {first_map.device}:{first_map.inode}")
        same = sum(a == b for a, b in zip(frames, first_frames))
        expect(same == len(frames),
               f"{label} and {first} map the same {len(frames)} physical pages",
               f"{same} of {len(frames)} page frames equal")
    log(f"first frames: {first_frames[:4]} ... last: {first_frames[-1]}")


def body():
    args = parse_args()
    docker = args.docker
    live_dir = os.path.abspath(args.live_dir)
    cleanup(docker)
    try:
        run([docker, "volume", "create", VOLUME])
        run([docker, "run", "-d", "--name", DAEMON] + HARDENED +
            ["-v", f"{VOLUME}:/run/tensord", "tensord:0.1.0"])
        _, waited = wait_for(
            "the daemon container healthy",
            lambda: run([docker, "inspect", "-f", "{{.State.Health.Status}}", DAEMON],
                        quiet=True) == "healthy", timeout=60)
        log(f"ok: the daemon container turned healthy {waited:.1f} s after `docker run`")
        run([docker, "inspect", "-f", "user {{.Config.User}}, read-only root "
             "{{.HostConfig.ReadonlyRootfs}}, cap-drop {{.HostConfig.CapDrop}}, security-opt "
             "{{.HostConfig.SecurityOpt}}, health log: {{range .State.Health.Log}}"
             "[exit {{.ExitCode}}: {{.Output}}] {{end}}", DAEMON])

        # The staging helper the daemon starts for device tensors across nodes is beside it
        # and runs in the image (started by hand, it says it is not for that).
        helper = subprocess.run([docker, "exec", DAEMON, "/usr/bin/tensord-stage"], capture_output=True, text=True)
        expect(helper.returncode == 2 and "usage: tensord-stage FD" in helper.stdout + helper.stderr,
               "the daemon image holds /usr/bin/tensord-stage, and it runs",
               f"exit {helper.returncode}: {helper.stdout}{helper.stderr}")

        published = json_line(run(client_container(docker, live_dir, "publish", NAME,
                                                    NBYTES, 7)), "the publishing container")
        log(f"published in a client container: {published}")

        reader, in_container = start_holder(
            client_container(docker, live_dir, "hold", NAME, interactive=True, name=READER),
            "the reading container")
        module = os.path.join(args.python_path, "tensord")
        expect(any(f.startswith("_tensord") and f.endswith(".so") for f in
                   os.listdir(module)) if os.path.isdir(module) else False,
               f"the host's Python module is built in {module}", "no _tensord*.so there")
        mountpoint = run([docker, "volume", "inspect", "-f", "{{.Mountpoint}}", VOLUME])
        env = dict(os.environ, PYTHONPATH=args.python_path,
                   TENSORD_SOCKET=f"{mountpoint}/tensord.sock",
                   TENSORD_TRUSTED_DAEMON_UIDS="10001")
        host, on_host = start_holder(
            ["/usr/bin/python3", os.path.join(live_dir, "tensor_peer.py"), "hold", NAME],
            "the host client", env=env)
        for label, facts in (("the reading container", in_container),
                             ("the host client", on_host)):
            expect(facts["sha256"] == published["sha256"] and facts["nbytes"] == NBYTES,
                   f"{label} reads the published bytes (sha256 {published['sha256'][:16]}...)",
                   facts)
            expect(facts["generation"] == published["generation"],
                   f"{label} sees generation {published['generation']}", facts["generation"])
        reader_pid = int(run([docker, "inspect", "-f", "{{.State.Pid}}", READER]))
        compare_pages([("the reading container", reader_pid, in_container),
                       ("the host client", host.pid, on_host)])
        finish_holder(reader, "the reading container")
        finish_holder(host, "the host client")

        run([docker, "exec", DAEMON, "/usr/bin/tensorctl", "status",
             "--socket", "/run/tensord/tensord.sock"])
        started = time.monotonic()
        run([docker, "stop", DAEMON])
        stopped_in = time.monotonic() - started
        exit_code = run([docker, "inspect", "-f", "{{.State.ExitCode}}", DAEMON])
        expect(exit_code == "0", "`docker stop` ends the daemon with exit status 0",
               f"exit status {exit_code}")
        expect(stopped_in < 15, "the daemon stops within its 15 s grace period",
               f"{stopped_in:.1f} s")
        log(f"docker stop took {stopped_in:.1f} s")
        log("--- docker logs of the daemon container")
        run([docker, "logs", DAEMON])
    finally:
        cleanup(docker)


if __name__ == "__main__":
    main_guard(body)
