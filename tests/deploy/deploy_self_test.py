"""check_deploy.py --self-test: breaks copies of the deploy files in a temporary folder, one
mutation at a time, and fails unless every mutation makes a check fail that did not fail
before.
"""

import os
import shutil
import tempfile

# Each mutation breaks one thing in a copy of the files; some check must then fail that
# did not fail before. (file under the copy, text, replacement, which occurrence, what the
# new failure must mention)
MUTATIONS = [
    ("deploy/docker/Dockerfile", '"/run/tensord/tensord.sock", "--socket-group"',
     '"/run/tensord/other.sock", "--socket-group"', 1, "TENSORD_SOCKET"),
    ("deploy/docker/Dockerfile", "      libre2-9 \\\n", "", 1, "libre2.so.9"),
    ("deploy/docker/Dockerfile", "      libfmt9 \\\n", "      libfmt99 \\\n", 1, "libfmt99"),
    ("deploy/docker/Dockerfile", "COPY server /src/server", "COPY serverx /src/server", 1, "serverx"),
    ("deploy/docker/Dockerfile", "COPY common /src/common\n", "", 1, "needs common"),
    ("deploy/docker/Dockerfile", "--uid 10001", "--uid 10002", 1, "uid"),
    ("deploy/docker/Dockerfile", "--target tensord tensorctl", "--target tensord tensorctlx", 1,
     "tensorctlx"),
    ("deploy/docker/Dockerfile", 'ENTRYPOINT ["/usr/bin/tensord", "--socket", "/run/tensord/tensord.sock", '
     '"--socket-group", "tensord"]', "ENTRYPOINT /usr/bin/tensord --socket /run/tensord/tensord.sock",
     1, "exec (JSON) form"),
    ("deploy/docker/Dockerfile", "-m 0750 /run/tensord", "-m 0770 /run/tensord", 1, "install -d -m"),
    ("deploy/docker/compose.yaml", "TENSORD_SOCKET: /run/tensord/tensord.sock",
     "TENSORD_SOCKET: /run/tensord/x.sock", 2, "services.trainer.environment.TENSORD_SOCKET"),
    ("deploy/docker/compose.yaml", "tensord-socket:/run/tensord:ro", "tensord-socket:/run/tensord2:ro",
     1, "services.producer.volumes"),
    ("deploy/docker/compose.yaml", "    environment:", "    enviroment:", 1, "enviroment"),
    ("deploy/docker/compose.yaml", "\nservices:\n", "\nservices:\n  - [\n", 1, "YAML"),
    ("deploy/docker/compose.yaml", "condition: service_healthy", "condition: service_started", 1,
     "depends_on"),
    ("deploy/docker/compose.yaml", '"--max-host-bytes", "3GiB"', '"--max-host-bytes", "5GiB"', 1,
     "mem_limit"),
    ("deploy/docker/compose.yaml", "taken += 1", "taken +== 1", 1, "does not compile"),
    ("deploy/docker/compose.yaml", 'user: "10001:10001"', 'user: "10002:10001"', 1, "user"),
    ("deploy/docker/compose.yaml", "context: ../..", "context: ..", 1, "build.context"),
    ("deploy/k8s/daemonset.yaml", "- --max-host-bytes", "- --max-host-byte", 1, "--max-host-byte"),
    ("deploy/k8s/daemonset.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", 2,
     "containers[tensord].securityContext.readOnlyRootFilesystem"),
    ("deploy/k8s/daemonset.yaml", "terminationGracePeriodSeconds: 15", "terminationGracePeriodSeconds: 3",
     1, "terminationGracePeriodSeconds"),
    ("deploy/k8s/daemonset.yaml", "containerPort: 9464", "containerPort: 9465", 1, "ports"),
    ("deploy/k8s/daemonset.yaml", "type: DirectoryOrCreate", "type: Directory", 1, "hostPath.type"),
    ("deploy/k8s/daemonset.yaml", "kind: DaemonSet", "kind: Deployment", 1, "DaemonSet tensord"),
    ("deploy/k8s/daemonset.yaml", "memory: 16Gi", "memory: 8Gi", 1, "limits.memory"),
    ("deploy/k8s/daemonset.yaml", '"health", "--socket"', '"healthz", "--socket"', 1, "healthz"),
    ("deploy/k8s/daemonset.yaml", "add: [CHOWN, FOWNER]", "add: [CHOWN, FOWNER, SYS_ADMIN]", 1,
     "SYS_ADMIN"),
    ("deploy/k8s/daemonset.yaml", 'prometheus.io/port: "9464"', 'prometheus.io/port: "9000"', 1,
     "prometheus.io/port"),
    ("deploy/k8s/daemonset.yaml", "runAsUser: 10001", "runAsUser: 10002", 1, "runAsUser"),
    ("deploy/k8s/daemonset.yaml", "chown 10001:10001", "chown 0:0", 1, "chowns to 0:0"),
    ("deploy/k8s/daemonset.yaml", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n",
     "apiVersion: v1\nkind: ConfigMap\n", 1, "selects the DaemonSet's pods"),
    ("deploy/k8s/daemonset.yaml", "  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: tensord\n",
     "  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: tensord-x\n", 1,
     "selects the DaemonSet's pods"),
    ("deploy/k8s/daemonset.yaml", "  policyTypes:\n    - Ingress\n", "  policyTypes:\n    - Egress\n", 1,
     "spec.policyTypes"),
    ("deploy/k8s/daemonset.yaml", "          port: 9464\n", "          port: 9000\n", 1,
     "spec.ingress[0].ports"),
    ("deploy/k8s/daemonset.yaml", '    - from:\n        - namespaceSelector:\n            matchLabels:\n'
     '              tensord.io/metrics-scraper: "true"\n      ports:', "    - ports:", 1,
     "spec.ingress[0].from"),
    ("deploy/k8s/daemonset.yaml", '            matchLabels:\n              tensord.io/metrics-scraper: "true"\n',
     "            {}\n", 1, "selects every namespace"),
    ("deploy/k8s/training-pod.yaml", "runAsUser: 10001", "runAsUser: 10002", 1, "runAsUser"),
    ("deploy/k8s/training-pod.yaml", "value: /run/tensord/tensord.sock", "value: /run/tensord/x.sock",
     3, "containers[trainer].env.TENSORD_SOCKET"),
    ("deploy/k8s/training-pod.yaml", "mountPath: /run/tensord", "mountPath: /run/tensord-x", 1,
     "volumeMounts"),
    ("deploy/k8s/training-pod.yaml", "path: /run/tensord\n", "path: /run/other\n", 1, "hostPath.path"),
    ("deploy/k8s/training-pod.yaml", "name: trainer", "name: learner", 1, "two workers and a trainer"),
    ("docs/deployment.md", "```yaml\n", "```yaml\n: - [\n", 1, "yaml block"),
    (".dockerignore", "!server\n", "", 1, "COPY source server"),
    (".dockerignore", "\n*\n", "\n", 1, "first rule"),
    (".dockerignore", "!proto\n", "!proto\n!docs\n", 1, "!docs"),
]


def replace_nth(text, old, new, nth):
    at = -1
    for _ in range(nth):
        at = text.find(old, at + 1)
        if at < 0:
            return None
    return text[:at] + new + text[at + len(old):]


def self_test(run_checks, repo, deploy, docs, binaries, libs):
    """Breaks copies of the files one way at a time; each break must make a new check fail.
    run_checks(repo, deploy, docs, binaries, libs) runs every check and returns the Report."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="check_deploy.") as tmp:
        copy_deploy = os.path.join(tmp, "deploy")
        for sub in ("docker", "k8s"):
            shutil.copytree(os.path.join(deploy, sub), os.path.join(copy_deploy, sub))
        shutil.copy(os.path.join(repo, ".dockerignore"), os.path.join(tmp, ".dockerignore"))
        os.makedirs(os.path.join(tmp, "docs"))
        copy_docs = os.path.join(tmp, "docs", "deployment.md")
        shutil.copy(docs, copy_docs)
        baseline = set(run_checks(repo, copy_deploy, copy_docs, binaries, libs).failures)
        print(f"self-test: the unbroken copy fails {len(baseline)} check(s); each break must add one")
        for rel, old, new, nth, expect in MUTATIONS:
            target = os.path.join(tmp, rel)
            original = open(target).read()
            broken = replace_nth(original, old, new, nth)
            label = f"{rel}: {old.strip()[:60]!r} -> {new.strip()[:60]!r}"
            if broken is None:
                problems.append(f"{label}: the text (occurrence {nth}) is not in the file any more; "
                                "update MUTATIONS")
                continue
            open(target, "w").write(broken)
            try:
                failures = set(run_checks(repo, copy_deploy, copy_docs, binaries, libs).failures)
            except Exception as e:  # a crash is not a detected break
                failures = set()
                problems.append(f"{label}: the checks crashed: {e!r}")
            finally:
                open(target, "w").write(original)
            new_failures = failures - baseline
            if any(expect in f for f in new_failures):
                print(f"  caught  {label}")
            else:
                problems.append(f"{label}: no new failure mentions {expect!r} "
                                f"(new failures: {sorted(new_failures) or 'none'})")
    for p in problems:
        print(f"SELF-TEST FAIL {p}")
    caught = len(MUTATIONS) - len(problems)
    print(f"self-test: {caught} passed, {len(problems)} failed")
    return not problems
