#!/usr/bin/env python3
"""Checks the container and Kubernetes files under deploy/ without a container engine.

This runs in ctest, where no container engine is assumed, so nothing here builds an image
or starts a pod (`tests/run_all.sh deploy` does, with tests/deploy/live/). What can be
checked without one is checked against the repository and the built binaries:

- every YAML file (and every ```yaml block of docs/deployment.md) parses;
- the Dockerfile: its stages, that every COPY source exists in the repository and is what
  .dockerignore keeps (and nothing else), that the
  folders the top-level CMakeLists.txt needs are copied, that the targets it builds exist,
  that the exec-form ENTRYPOINT runs tensord on the socket the volume holds;
- the runtime packages cover every shared library `ldd` reports for the built binaries
  (mapped to Debian packages with `dpkg -S`);
- every tensord flag used in the files is in `tensord --help`, and the daemon accepts the
  whole command line (`tensord --print-config` with it); every tensorctl subcommand and flag
  is in `tensorctl --help`;
- the Kubernetes objects have the kinds and fields docs/deployment.md relies on; the compose
  services too; a metrics address reachable from outside the pod comes with a NetworkPolicy
  that lets only named peers reach only the metrics port;
- the socket path, the volume mount and the clients' TENSORD_SOCKET agree everywhere, and
  so do the uid and gid (10001) and the image tags (the project version);
- the inline Python programs of the example clients compile.

Each failure prints the file, the field and why; the exit status is 1 when any check
fails. --self-test breaks copies of the files in a temporary folder, one mutation at a
time, and fails unless every mutation makes a check fail that did not fail before.

The checks live in the deploy_*.py modules beside this file: deploy_common (the report,
units), deploy_binaries (--help, ldd, packages, command lines), deploy_dockerfile,
deploy_compose, deploy_kubernetes and deploy_self_test.

Usage: check_deploy.py --tensord PATH --tensorctl PATH [--lib PATH]... [--self-test]
"""

import argparse
import os
import re
import sys

try:
    import yaml
except ImportError:
    sys.exit("check_deploy: python3-yaml is missing (deploy/install-deps.sh installs it)")

from deploy_binaries import Binaries  # noqa: E402  (after the check for yaml, which they import)
from deploy_common import Report  # noqa: E402
from deploy_compose import check_compose  # noqa: E402
from deploy_dockerfile import Daemon, check_dockerfile  # noqa: E402
from deploy_kubernetes import check_daemonset, check_training_pod  # noqa: E402
from deploy_self_test import self_test  # noqa: E402


# ----------------------------------------------------------------------------- docs


def check_docs(report, path):
    text = open(path).read()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    report.expect(bool(blocks), path, "```yaml blocks", "none found")
    for i, block in enumerate(blocks, 1):
        try:
            list(yaml.safe_load_all(block))
            error = None
        except yaml.YAMLError as e:
            error = e
        report.expect(error is None, path, f"```yaml block {i}", f"does not parse: {error}")
    for mention in ("deploy/docker/Dockerfile", "deploy/docker/compose.yaml",
                    "deploy/k8s/daemonset.yaml", "deploy/k8s/training-pod.yaml",
                    "deploy/k8s/cluster.yaml", "tests/deploy/check_deploy.py"):
        report.expect(mention in text, path, "text", f"does not mention {mention}")


# ----------------------------------------------------------------------------- main


def run_checks(repo, deploy, docs, binaries, libs):
    report = Report(os.path.dirname(deploy))
    daemon = Daemon()
    m = re.search(r"project\(tensord VERSION ([\d.]+)", open(os.path.join(repo, "CMakeLists.txt")).read())
    daemon.version = m.group(1) if m else None
    dockerfile = os.path.join(deploy, "docker", "Dockerfile")
    stages = check_dockerfile(report, repo, dockerfile, daemon, binaries, libs)
    check_compose(report, os.path.join(deploy, "docker", "compose.yaml"), deploy, dockerfile,
                  stages, daemon, binaries)
    served = check_daemonset(report, os.path.join(deploy, "k8s", "daemonset.yaml"), daemon, binaries)
    check_training_pod(report, os.path.join(deploy, "k8s", "training-pod.yaml"), daemon, served or {})
    check_docs(report, docs)
    return report


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo-root", default=os.path.normpath(os.path.join(here, "..", "..")))
    parser.add_argument("--deploy-dir", help="default: REPO/deploy")
    parser.add_argument("--docs", help="default: REPO/docs/deployment.md")
    parser.add_argument("--tensord", required=True, help="the built daemon")
    parser.add_argument("--tensorctl", required=True, help="the built CLI")
    parser.add_argument("--lib", action="append", default=[],
                        help="a library the client stage carries (libtensord, the Python module)")
    parser.add_argument("--self-test", action="store_true",
                        help="break copies of the files and expect the checks to catch each")
    args = parser.parse_args()
    repo = os.path.abspath(args.repo_root)
    deploy = os.path.abspath(args.deploy_dir or os.path.join(repo, "deploy"))
    docs = os.path.abspath(args.docs or os.path.join(repo, "docs", "deployment.md"))
    binaries = Binaries(os.path.abspath(args.tensord), os.path.abspath(args.tensorctl))
    libs = tuple(os.path.abspath(lib) for lib in args.lib)
    if args.self_test:
        return 0 if self_test(run_checks, repo, deploy, docs, binaries, libs) else 1
    report = run_checks(repo, deploy, docs, binaries, libs)
    for failure in report.failures:
        print(f"FAIL {failure}")
    print(f"deploy checks: {report.passed} passed, {len(report.failures)} failed")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
