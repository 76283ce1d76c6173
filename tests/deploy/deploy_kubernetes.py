"""The Kubernetes objects (deploy/k8s): the DaemonSet that serves tensord on every node (its
pod's security, the socket directory on the host, the daemon's command line and probes,
resources, the metrics port and the NetworkPolicy that guards it) and the training pod whose
containers reach the daemon through that directory.
"""

import os
import posixpath
import re

import yaml

from deploy_binaries import check_tensorctl_command, check_tensord_command, option_value
from deploy_common import DRAIN_SECONDS, check_image_tag, check_python, k8s_bytes

# The init container may fix the hostPath directory's owner and mode, nothing more.
INIT_CAPABILITIES = {"CHOWN", "FOWNER"}


# ----------------------------------------------------------------------- Kubernetes


def load_docs(report, path):
    try:
        docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
    except yaml.YAMLError as e:
        report.expect(False, path, "YAML", f"does not parse: {e}")
        return None
    report.expect(all(isinstance(d, dict) for d in docs), path, "YAML", "a document is not a mapping")
    return [d for d in docs if isinstance(d, dict)]


def find(docs, kind, name):
    return next((d for d in docs if d.get("kind") == kind
                 and (d.get("metadata") or {}).get("name") == name), None)


def dig(obj, *keys):
    for key in keys:
        if isinstance(obj, dict):
            obj = obj.get(key)
        elif isinstance(obj, list) and isinstance(key, int) and key < len(obj):
            obj = obj[key]
        else:
            return None
    return obj


def check_restricted(report, path, field, context):
    report.expect(dig(context, "allowPrivilegeEscalation") is False, path,
                  f"{field}.securityContext.allowPrivilegeEscalation", "must be false")
    report.expect(dig(context, "readOnlyRootFilesystem") is True, path,
                  f"{field}.securityContext.readOnlyRootFilesystem", "must be true")
    report.expect("ALL" in (dig(context, "capabilities", "drop") or []), path,
                  f"{field}.securityContext.capabilities.drop", "must drop ALL")


def mount_of(container, volume):
    return next((m for m in container.get("volumeMounts") or [] if m.get("name") == volume), None)


def selects(selector, labels):
    """Whether a Kubernetes label selector selects an object with these labels; an empty
    selector selects everything, an unknown operator nothing."""
    if not isinstance(selector, dict):
        return False
    labels = {k: str(v) for k, v in labels.items()}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != str(value):
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key"), expr.get("operator")
        values = [str(v) for v in expr.get("values") or []]
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels,
              "DoesNotExist": key not in labels}.get(op, False)
        if not ok:
            return False
    return True


def empty_selector(selector):
    return not (dig(selector, "matchLabels") or dig(selector, "matchExpressions"))


def check_metrics_policy(report, path, docs, namespace, labels, metrics, port, container_ports):
    """A metrics address reachable from outside the pod must be limited by a NetworkPolicy
    of the same namespace that selects the pods and lets in only the metrics port, from
    named peers. The metrics page shows every namespace's name, tensors and bytes, which the
    gRPC Status call shows each caller only for the namespaces it may read."""
    names = {p.get("name") for p in container_ports if p.get("containerPort") == port and p.get("name")}
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy"
                and dig(d, "metadata", "namespace") == namespace
                and selects(dig(d, "spec", "podSelector"), labels)]
    if not report.expect(bool(policies), path, "NetworkPolicy",
                         f"none in namespace {namespace} selects the DaemonSet's pods {labels}: "
                         f"the metrics page on {metrics} is open to every pod of the cluster"):
        return
    rules = 0
    for policy in policies:
        pf = f"NetworkPolicy {dig(policy, 'metadata', 'name')}"
        report.expect(policy.get("apiVersion") == "networking.k8s.io/v1", path, f"{pf}.apiVersion",
                      f"{policy.get('apiVersion')}, not networking.k8s.io/v1")
        spec = policy.get("spec") or {}
        types = spec.get("policyTypes")
        # Without policyTypes a policy limits ingress; with them, only if Ingress is listed.
        if not report.expect(types is None or "Ingress" in types, path, f"{pf}.spec.policyTypes",
                             f"{types} leaves out Ingress: the policy does not limit who reaches "
                             "the pod"):
            continue
        for i, rule in enumerate(spec.get("ingress") or []):
            rf = f"{pf}.spec.ingress[{i}]"
            rules += 1
            ports = (rule or {}).get("ports") or []
            report.expect(bool(ports), path, f"{rf}.ports",
                          "none: the rule opens every port of the pod, the daemon needs only "
                          f"the metrics port {port}")
            for entry in ports:
                report.expect((entry.get("port") == port or entry.get("port") in names)
                              and entry.get("protocol", "TCP") == "TCP"
                              and entry.get("endPort") in (None, port), path, f"{rf}.ports",
                              f"{entry}: not the metrics port TCP {port}")
            peers = (rule or {}).get("from") or []
            report.expect(bool(peers), path, f"{rf}.from",
                          "none: every source may connect; name the monitoring's namespace")
            for j, peer in enumerate(peers):
                peer = peer or {}
                report.expect(bool(peer), path, f"{rf}.from[{j}]", "an empty peer")
                if "namespaceSelector" in peer:
                    report.expect(not empty_selector(peer["namespaceSelector"]), path,
                                  f"{rf}.from[{j}].namespaceSelector",
                                  "empty: it selects every namespace of the cluster")
                if "ipBlock" in peer:
                    report.expect(not str(dig(peer, "ipBlock", "cidr")).endswith("/0"), path,
                                  f"{rf}.from[{j}].ipBlock",
                                  f"{dig(peer, 'ipBlock', 'cidr')} lets in every address")
    report.expect(rules > 0, path, "NetworkPolicy",
                  f"no ingress rule lets the monitoring reach the metrics port {port}")


# What the downward API gives a pod, for the values a manifest takes from it.
DOWNWARD_STAND_INS = {"spec.nodeName": "node-1", "status.podIP": "10.0.0.1", "metadata.name": "tensord-x1"}


def container_env(report, path, container):
    """The container's environment as the kubelet sets it: the ConfigMaps of envFrom (those
    this directory defines; an optional one that is absent adds nothing), then env, its
    downward-API values given stand-ins and $(VAR) references expanded."""
    here = os.path.dirname(path)
    config_maps = {}
    for name in sorted(os.listdir(here)):
        if name.endswith(".yaml"):
            for doc in load_docs(report, os.path.join(here, name)) or []:
                if doc.get("kind") == "ConfigMap":
                    config_maps[dig(doc, "metadata", "name")] = doc.get("data") or {}
    env = {}
    for source in container.get("envFrom") or []:
        name = dig(source, "configMapRef", "name")
        found = config_maps.get(name)
        report.expect(found is not None or dig(source, "configMapRef", "optional") is True, path,
                      "envFrom", f"ConfigMap {name} is defined nowhere in {here} and not optional")
        env.update(found or {})
    for entry in container.get("env") or []:
        field = dig(entry, "valueFrom", "fieldRef", "fieldPath")
        value = DOWNWARD_STAND_INS.get(field) if field else entry.get("value")
        report.expect(value is not None, path, f"env.{entry.get('name')}", "no value this check can stand in for")
        value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value or "")
        env[entry.get("name")] = value
    return env


def check_daemonset(report, path, daemon, binaries):
    docs = load_docs(report, path)
    if docs is None:
        return None
    ns = find(docs, "Namespace", "tensord")
    report.expect(ns is not None and ns.get("apiVersion") == "v1", path, "Namespace tensord",
                  "missing (apiVersion v1, kind Namespace, name tensord)")
    ds = find(docs, "DaemonSet", "tensord")
    if not report.expect(ds is not None and ds.get("apiVersion") == "apps/v1", path,
                         "DaemonSet tensord", "missing (apiVersion apps/v1, kind DaemonSet, "
                         "name tensord)"):
        return None
    report.expect(dig(ds, "metadata", "namespace") == "tensord", path,
                  "DaemonSet.metadata.namespace", "not tensord")
    f = "DaemonSet.spec.template"
    template = dig(ds, "spec", "template") or {}
    labels = dig(template, "metadata", "labels") or {}
    selector = dig(ds, "spec", "selector", "matchLabels") or {}
    report.expect(bool(selector) and all(labels.get(k) == v for k, v in selector.items()), path,
                  "DaemonSet.spec.selector.matchLabels", "empty or does not match the template's labels")
    spec = template.get("spec") or {}
    grace = spec.get("terminationGracePeriodSeconds")
    report.expect(isinstance(grace, int) and grace > DRAIN_SECONDS, path,
                  f"{f}.spec.terminationGracePeriodSeconds",
                  f"{grace}: must exceed the daemon's {DRAIN_SECONDS} s drain")
    pod_sc = spec.get("securityContext") or {}
    report.expect(pod_sc.get("runAsUser") == daemon.uid, path, f"{f}.spec.securityContext.runAsUser",
                  f"{pod_sc.get('runAsUser')}, not the image's uid {daemon.uid}")
    report.expect(pod_sc.get("runAsGroup") == daemon.gid, path, f"{f}.spec.securityContext.runAsGroup",
                  f"{pod_sc.get('runAsGroup')}, not the image's gid {daemon.gid}")
    report.expect(pod_sc.get("runAsNonRoot") is True, path, f"{f}.spec.securityContext.runAsNonRoot",
                  "must be true")
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    containers = spec.get("containers") or []
    main = next((c for c in containers if c.get("name") == "tensord"), None)
    if not report.expect(main is not None, path, f"{f}.spec.containers", "no container named tensord"):
        return None
    cf = f"{f}.spec.containers[tensord]"
    check_image_tag(report, path, f"{cf}.image", main.get("image"), "tensord", daemon)
    argv = list(main.get("command") or daemon.entrypoint or []) + list(main.get("args") or [])
    env = container_env(report, path, main)
    report.expect(bool(argv) and os.path.basename(argv[0]) == "tensord", path, f"{cf}.command",
                  "does not run tensord")
    config = check_tensord_command(report, path, f"{cf}.command+args", argv, env, daemon, binaries)
    # Every setting the environment gives is one tensord has (it ignores unknown TENSORD_*).
    for key in sorted(k for k in env if k.startswith("TENSORD_")):
        setting = key[len("TENSORD_"):].lower()
        report.expect(config is None or setting in config or key == "TENSORD_SOCKET", path, f"{cf}.env.{key}",
                      f"tensord has no setting {setting} (not in tensord --print-config)")
    socket = option_value(argv, "--socket") or (config or {}).get("socket")
    report.expect(socket == daemon.socket, path, f"{cf}.args --socket",
                  f"{socket}, not the image's {daemon.socket}")
    if "TENSORD_SOCKET" in env:
        report.expect(env["TENSORD_SOCKET"] == socket, path, f"{cf}.env.TENSORD_SOCKET",
                      f"{env['TENSORD_SOCKET']}, not the --socket {socket}")
    group = option_value(argv, "--socket-group")
    report.expect(group in (daemon.group, str(daemon.gid)), path, f"{cf}.args --socket-group",
                  f"{group} is not the image's group {daemon.group} (gid {daemon.gid})")
    check_restricted(report, path, cf, main.get("securityContext"))
    report.expect(not dig(main, "securityContext", "capabilities", "add"), path,
                  f"{cf}.securityContext.capabilities.add", "the daemon needs no capability")
    # Memory: host tensors are charged to the daemon's cgroup.
    limit = k8s_bytes(dig(main, "resources", "limits", "memory") or "")
    report.expect(dig(main, "resources", "requests", "memory") is not None
                  and dig(main, "resources", "requests", "cpu") is not None, path,
                  f"{cf}.resources.requests", "needs cpu and memory")
    if report.expect(limit is not None, path, f"{cf}.resources.limits.memory",
                     "missing or unreadable: host tensors are charged to the daemon") and config:
        report.expect("--max-host-bytes" in argv, path, f"{cf}.args",
                      "set --max-host-bytes explicitly under limits.memory")
        report.expect(config.get("max_host_bytes", 0) < limit, path, f"{cf}.args --max-host-bytes",
                      f"{config.get('max_host_bytes')} bytes is not below limits.memory "
                      f"{dig(main, 'resources', 'limits', 'memory')}")
    # Metrics: the port of --metrics-address is the containerPort and the scrape annotation.
    metrics = option_value(argv, "--metrics-address")
    port = None
    reachable = False
    if report.expect(metrics is not None and re.fullmatch(r"[\w.:\[\]-]+:\d+", metrics) is not None,
                     path, f"{cf}.args --metrics-address",
                     f"{metrics}: must be HOST:PORT so Prometheus can reach it"):
        port = int(metrics.rsplit(":", 1)[1])
        reachable = not metrics.startswith(("127.", "localhost", "[::1]"))
        report.expect(reachable, path, f"{cf}.args --metrics-address",
                      f"{metrics} is not reachable from outside the pod")
    ports = [p.get("containerPort") for p in main.get("ports") or []]
    report.expect(port in ports, path, f"{cf}.ports", f"{ports} does not expose the metrics port {port}")
    notes = dig(template, "metadata", "annotations") or {}
    report.expect(notes.get("prometheus.io/scrape") == "true", path,
                  f"{f}.metadata.annotations.prometheus.io/scrape", "must be \"true\"")
    report.expect(notes.get("prometheus.io/port") == str(port), path,
                  f"{f}.metadata.annotations.prometheus.io/port",
                  f"{notes.get('prometheus.io/port')}, not the metrics port {port}")
    if reachable:
        check_metrics_policy(report, path, docs, dig(ds, "metadata", "namespace"), labels, metrics,
                             port, main.get("ports") or [])
    # Health: exec probes through tensorctl (the grpc probe speaks TCP only).
    for probe in ("readinessProbe", "livenessProbe"):
        command = dig(main, probe, "exec", "command")
        if report.expect(isinstance(command, list), path, f"{cf}.{probe}.exec.command",
                         "missing: the daemon has no TCP health endpoint"):
            check_tensorctl_command(report, path, f"{cf}.{probe}", command, daemon, binaries,
                                    want="health")
    # The socket directory: a hostPath the daemon's container and the init container mount.
    socket_dir = posixpath.dirname(socket) if socket else None
    mount = next((m for m in main.get("volumeMounts") or [] if m.get("mountPath") == socket_dir), None)
    host = None
    if report.expect(mount is not None, path, f"{cf}.volumeMounts",
                     f"nothing is mounted at the socket directory {socket_dir}"):
        host = dig(volumes.get(mount.get("name")), "hostPath")
        if report.expect(host is not None, path, f"{f}.spec.volumes[{mount.get('name')}]",
                         "not a hostPath: pods on the node could not reach the socket"):
            report.expect(host.get("type") == "DirectoryOrCreate", path,
                          f"{f}.spec.volumes[{mount.get('name')}].hostPath.type",
                          f"{host.get('type')}, not DirectoryOrCreate")
    for init in spec.get("initContainers") or []:
        inf = f"{f}.spec.initContainers[{init.get('name')}]"
        check_restricted(report, path, inf, init.get("securityContext"))
        added = set(dig(init, "securityContext", "capabilities", "add") or [])
        report.expect(added <= INIT_CAPABILITIES, path, f"{inf}.securityContext.capabilities.add",
                      f"{sorted(added - INIT_CAPABILITIES)}: only {sorted(INIT_CAPABILITIES)} "
                      "are needed to fix the directory")
        text = " ".join(init.get("command") or []) + " " + " ".join(init.get("args") or [])
        owner = re.search(r"chown (\d+):(\d+) (\S+)", text)
        if report.expect(owner is not None, path, f"{inf}.command", "no chown UID:GID DIR"):
            report.expect((int(owner.group(1)), int(owner.group(2))) == (daemon.uid, daemon.gid),
                          path, f"{inf}.command", f"chowns to {owner.group(1)}:{owner.group(2)}, "
                          f"not {daemon.uid}:{daemon.gid}")
            report.expect(owner.group(3) == socket_dir, path, f"{inf}.command",
                          f"chowns {owner.group(3)}, not the socket directory {socket_dir}")
            report.expect(mount is not None and mount_of(init, mount.get("name")) is not None
                          and mount_of(init, mount.get("name")).get("mountPath") == socket_dir,
                          path, f"{inf}.volumeMounts", f"does not mount the socket volume at {socket_dir}")
        check_image_tag(report, path, f"{inf}.image", init.get("image"), "tensord", daemon)
    return {"socket": socket, "host_path": (host or {}).get("path")}


def check_training_pod(report, path, daemon, served):
    docs = load_docs(report, path)
    if docs is None:
        return
    pod = next((d for d in docs if d.get("kind") == "Pod"), None)
    if not report.expect(pod is not None and pod.get("apiVersion") == "v1", path, "Pod",
                         "missing (apiVersion v1, kind Pod)"):
        return
    spec = pod.get("spec") or {}
    sc = spec.get("securityContext") or {}
    report.expect(sc.get("runAsUser") == daemon.uid, path, "Pod.spec.securityContext.runAsUser",
                  f"{sc.get('runAsUser')}, not the daemon's uid {daemon.uid}: the client library "
                  "refuses a daemon of another uid, and without ACLs only the daemon's uid may use "
                  "a namespace")
    report.expect(sc.get("runAsGroup") == daemon.gid, path, "Pod.spec.securityContext.runAsGroup",
                  f"{sc.get('runAsGroup')}, not the daemon's gid {daemon.gid}")
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    containers = spec.get("containers") or []
    names = [c.get("name") for c in containers]
    report.expect(len(containers) >= 3 and "trainer" in names, path, "Pod.spec.containers",
                  f"{names}: the example has two workers and a trainer")
    for c in containers:
        cf = f"Pod.spec.containers[{c.get('name')}]"
        check_image_tag(report, path, f"{cf}.image", c.get("image"), "tensord-client", daemon)
        env = {e.get("name"): e.get("value") for e in c.get("env") or []}
        socket = env.get("TENSORD_SOCKET")
        report.expect(socket == served.get("socket"), path, f"{cf}.env.TENSORD_SOCKET",
                      f"{socket}, not the daemon's socket {served.get('socket')}")
        socket_dir = posixpath.dirname(socket or "")
        mount = next((m for m in c.get("volumeMounts") or [] if m.get("mountPath") == socket_dir), None)
        if report.expect(mount is not None, path, f"{cf}.volumeMounts",
                         f"nothing is mounted at {socket_dir}, the directory of TENSORD_SOCKET"):
            host = dig(volumes.get(mount.get("name")), "hostPath") or {}
            report.expect(host.get("path") == served.get("host_path"), path,
                          f"Pod.spec.volumes[{mount.get('name')}].hostPath.path",
                          f"{host.get('path')}, not the DaemonSet's {served.get('host_path')}")
            report.expect(host.get("type") == "Directory", path,
                          f"Pod.spec.volumes[{mount.get('name')}].hostPath.type",
                          f"{host.get('type')}, not Directory (made by the DaemonSet; a pod must "
                          "not create an empty one)")
        check_restricted(report, path, cf, c.get("securityContext"))
        check_python(report, path, f"{cf}.command", list(c.get("command") or []) + list(c.get("args") or []))
