"""The compose file (deploy/docker/compose.yaml): only keys the Compose Specification knows,
services built from the Dockerfile's stages, and the daemon's command line, user, socket
volume, health check, memory limit and stop grace period consistent with the Dockerfile.
"""

import os
import posixpath

import yaml

from deploy_binaries import check_tensord_command
from deploy_common import (DRAIN_SECONDS, check_image_tag, check_python, docker_bytes,
                           duration_seconds)
from deploy_dockerfile import last_instruction, stage_env

# The Compose Specification's top-level elements and service attributes: a misspelt key
# would otherwise be ignored (with a warning) by a Compose implementation.
COMPOSE_TOP_LEVEL = {"version", "name", "services", "networks", "volumes", "configs", "secrets",
                     "include", "models"}
COMPOSE_SERVICE_KEYS = {
    "annotations", "attach", "blkio_config", "build", "cap_add", "cap_drop", "cgroup",
    "cgroup_parent", "command", "configs", "container_name", "cpu_count", "cpu_percent",
    "cpu_period", "cpu_quota", "cpu_rt_period", "cpu_rt_runtime", "cpu_shares", "cpus", "cpuset",
    "credential_spec", "depends_on", "deploy", "develop", "device_cgroup_rules", "devices", "dns",
    "dns_opt", "dns_search", "domainname", "driver_opts", "entrypoint", "env_file", "environment",
    "expose", "extends", "external_links", "extra_hosts", "gpus", "group_add", "healthcheck",
    "hostname", "image", "init", "ipc", "isolation", "label_file", "labels", "links", "logging",
    "mac_address", "mem_limit", "mem_reservation", "mem_swappiness", "memswap_limit", "models",
    "network_mode", "networks", "oom_kill_disable", "oom_score_adj", "pid", "pids_limit",
    "platform", "ports", "post_start", "pre_stop", "privileged", "profiles", "provider",
    "pull_policy", "read_only", "restart", "runtime", "scale", "secrets", "security_opt",
    "shm_size", "stdin_open", "stop_grace_period", "stop_signal", "storage_opt", "sysctls",
    "tmpfs", "tty", "ulimits", "use_api_socket", "user", "userns_mode", "uts", "volumes",
    "volumes_from", "working_dir"}


# ------------------------------------------------------------------------- compose


def check_compose(report, path, deploy, dockerfile, stages, daemon, binaries):
    try:
        doc = yaml.safe_load(open(path))
    except yaml.YAMLError as e:
        report.expect(False, path, "YAML", f"does not parse: {e}")
        return
    if not report.expect(isinstance(doc, dict), path, "YAML", "not a mapping"):
        return
    for key in doc:
        report.expect(key in COMPOSE_TOP_LEVEL or key.startswith("x-"), path, key,
                      "not a top-level element of the Compose Specification")
    services = doc.get("services") or {}
    for name in ("tensord", "producer", "trainer"):
        report.expect(name in services, path, f"services.{name}", "missing")
    volumes = doc.get("volumes") or {}
    report.expect("tensord-socket" in volumes, path, "volumes.tensord-socket",
                  "the socket volume is not declared")
    stage_names = {s.name for s in stages}
    compose_dir = os.path.dirname(path)
    config = None
    for name, service in services.items():
        field = f"services.{name}"
        if not report.expect(isinstance(service, dict), path, field, "not a mapping"):
            continue
        for key in service:
            report.expect(key in COMPOSE_SERVICE_KEYS or key.startswith("x-"), path,
                          f"{field}.{key}", "not a service attribute of the Compose Specification")
        build = service.get("build")
        target = None
        if report.expect(isinstance(build, dict), path, f"{field}.build",
                         "must name context, dockerfile and target"):
            context = os.path.normpath(os.path.join(compose_dir, build.get("context", ".")))
            report.expect(context == os.path.dirname(deploy), path, f"{field}.build.context",
                          f"{build.get('context')} is not the repository root (the Dockerfile "
                          "copies paths relative to it)")
            report.expect(os.path.normpath(os.path.join(context, build.get("dockerfile", "")))
                          == os.path.normpath(dockerfile), path, f"{field}.build.dockerfile",
                          f"{build.get('dockerfile')} is not {report.rel(dockerfile)}")
            target = build.get("target")
            report.expect(target in stage_names, path, f"{field}.build.target",
                          f"{target} is not a stage of the Dockerfile ({sorted(stage_names)})")
        mounts = service.get("volumes") or []
        mount_points = {}
        for m in mounts:
            if isinstance(m, str):
                parts = m.split(":")
                if len(parts) >= 2:
                    mount_points[parts[1]] = parts[0]
            elif isinstance(m, dict):
                mount_points[m.get("target")] = m.get("source")
        socket_dir = posixpath.dirname(daemon.socket) if daemon.socket else None
        report.expect(mount_points.get(socket_dir) == "tensord-socket", path, f"{field}.volumes",
                      f"tensord-socket is not mounted at the socket directory {socket_dir}")
        if name == "tensord":
            check_image_tag(report, path, f"{field}.image", service.get("image"), "tensord", daemon)
            report.expect(target == stages[-1].name if stages else False, path,
                          f"{field}.build.target", "the daemon service must build the daemon stage")
            command = service.get("command") or []
            if not report.expect(isinstance(command, list), path, f"{field}.command",
                                 "use the list form (it is appended to the ENTRYPOINT)"):
                command = []
            if daemon.entrypoint:
                env = dict(stage_env(stages, target))
                env.update(service.get("environment") or {})
                config = check_tensord_command(report, path, f"{field}.command",
                                               daemon.entrypoint + command, env, daemon, binaries)
            grace = duration_seconds(service.get("stop_grace_period", "10s"))
            report.expect(grace is not None and grace > DRAIN_SECONDS, path,
                          f"{field}.stop_grace_period",
                          f"{service.get('stop_grace_period')}: must exceed the {DRAIN_SECONDS} s drain")
            limit = docker_bytes(service.get("mem_limit", ""))
            if report.expect(limit is not None, path, f"{field}.mem_limit",
                             "missing or unreadable: host tensors are charged to the daemon"):
                if config:
                    report.expect("--max-host-bytes" in " ".join(command), path, f"{field}.command",
                                  "set --max-host-bytes explicitly under mem_limit")
                    report.expect(config.get("max_host_bytes", 0) < limit, path,
                                  f"{field}.command --max-host-bytes",
                                  f"{config.get('max_host_bytes')} bytes is not below mem_limit "
                                  f"{service.get('mem_limit')}")
            report.expect(service.get("read_only") is True, path, f"{field}.read_only",
                          "the daemon writes only to the socket volume")
            report.expect("ALL" in (service.get("cap_drop") or []), path, f"{field}.cap_drop",
                          "the daemon needs no capability")
            health = service.get("healthcheck") or last_instruction(stages, target, "HEALTHCHECK")
            report.expect(health is not None, path, f"{field}.healthcheck",
                          "neither compose nor the image defines one; the clients wait on it")
        else:
            check_image_tag(report, path, f"{field}.image", service.get("image"),
                            "tensord-client", daemon)
            env = service.get("environment") or {}
            if isinstance(env, list):
                env = dict(e.split("=", 1) for e in env)
            report.expect(env.get("TENSORD_SOCKET") == daemon.socket, path,
                          f"{field}.environment.TENSORD_SOCKET",
                          f"{env.get('TENSORD_SOCKET')}, not the daemon's socket {daemon.socket}")
            user = str(service.get("user", ""))
            report.expect(user == f"{daemon.uid}:{daemon.gid}", path, f"{field}.user",
                          f"'{user}', not {daemon.uid}:{daemon.gid}: the client library refuses a "
                          "daemon of another uid, and without ACLs only the daemon's uid may use a "
                          "namespace")
            depends = (service.get("depends_on") or {}).get("tensord") \
                if isinstance(service.get("depends_on"), dict) else None
            report.expect(isinstance(depends, dict) and depends.get("condition") == "service_healthy",
                          path, f"{field}.depends_on.tensord",
                          "must wait for condition: service_healthy (the socket exists only then)")
            command = service.get("command")
            if report.expect(isinstance(command, list), path, f"{field}.command", "not a list"):
                check_python(report, path, f"{field}.command", command)
