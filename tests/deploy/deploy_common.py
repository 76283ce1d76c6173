"""What every part of check_deploy.py uses: the Report that counts checks and records
failures, running a program, the daemon's drain time, sizes and durations in Docker's and
Kubernetes' units, and the checks that the compose file and the Kubernetes objects share
(inline Python programs compile, image tags carry the project version).
"""

import os
import re
import subprocess

DRAIN_SECONDS = 5  # the daemon's SIGTERM drain (DESIGN.md); grace periods must exceed it


class Report:
    def __init__(self, base):
        self.base = base
        self.passed = 0
        self.failures = []

    def rel(self, path):
        return os.path.relpath(path, self.base) if os.path.isabs(path) else path

    def expect(self, ok, path, field, why):
        """Counts a check; a failed one is recorded as 'file: field: why'."""
        if ok:
            self.passed += 1
        else:
            self.failures.append(f"{self.rel(path)}: {field}: {why}")
        return ok


def run(argv, env=None):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env)
    return proc.returncode, proc.stdout, proc.stderr


# --------------------------------------------------------------------------- units

K8S_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12, "": 1}
DOCKER_UNITS = {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "": 1}


def k8s_bytes(value):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T|)", str(value))
    return int(m.group(1)) * K8S_UNITS[m.group(2)] if m else None


def docker_bytes(value):
    m = re.fullmatch(r"(\d+)([bkmg]?)b?", str(value).lower())
    return int(m.group(1)) * DOCKER_UNITS[m.group(2)] if m else None


def duration_seconds(value):
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)", str(value))
    if not parts or "".join(a + b for a, b in parts) != str(value):
        return None
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    return sum(float(a) * scale[b] for a, b in parts)


def check_python(report, path, field, argv):
    """An inline `python3 -c PROGRAM` compiles."""
    if len(argv) >= 3 and argv[0].startswith("python3") and argv[1] == "-c":
        try:
            compile(argv[2], f"{path}:{field}", "exec")
            error = None
        except SyntaxError as e:
            error = e
        report.expect(error is None, path, field, f"the Python program does not compile: {error}")


def check_image_tag(report, path, field, image, name, daemon):
    report.expect(image == f"{name}:{daemon.version}", path, field,
                  f"{image}, not {name}:{daemon.version} (the project version the docs tag)")
