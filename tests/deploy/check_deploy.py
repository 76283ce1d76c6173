#!/usr/bin/env python3
"""Checks the container and Kubernetes files under deploy/ without a container engine.

No container engine runs on the project's machines, so nothing here builds an image or
starts a pod. What can be checked without one is checked against the repository and the
built binaries:

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

Usage: check_deploy.py --tensord PATH --tensorctl PATH [--lib PATH]... [--self-test]
"""

import argparse
import dataclasses
import functools
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    sys.exit("check_deploy: python3-yaml is missing (deploy/install-deps.sh installs it)")

DRAIN_SECONDS = 5  # the daemon's SIGTERM drain (DESIGN.md); grace periods must exceed it

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
# The init container may fix the hostPath directory's owner and mode, nothing more.
INIT_CAPABILITIES = {"CHOWN", "FOWNER"}


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


# ---------------------------------------------------------------------------- binaries


@dataclasses.dataclass
class Help:
    flags: dict  # "--flag" -> whether it takes a value
    subcommands: set


@functools.lru_cache(maxsize=None)
def read_help(binary, subcommand=None):
    argv = [binary] + ([subcommand] if subcommand else []) + ["--help"]
    rc, out, err = run(argv)
    if rc != 0:
        return None
    flags = {}
    subcommands = set()
    section = None
    for line in out.splitlines():
        if re.match(r"^[A-Z][A-Za-z ]*:$", line):
            section = line[:-1]
            continue
        if section == "Options":
            m = re.match(r"^\s+(?:-\w,)?(--[\w-]+)(?:,-\w)?( [A-Z][A-Z_.]*)?", line)
            if m:
                flags[m.group(1)] = bool(m.group(2))
        elif section == "Subcommands":
            m = re.match(r"^\s+([a-z][\w-]*)\s", line)
            if m:
                subcommands.add(m.group(1))
    return Help(flags, subcommands)


@functools.lru_cache(maxsize=None)
def ldd(binary):
    """{soname: resolved path or None when not found}, without the vDSO."""
    rc, out, err = run(["ldd", binary])
    if rc != 0:
        return None
    libs = {}
    for line in out.splitlines():
        line = line.strip()
        m = re.match(r"^(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))$", line)
        if m:
            libs[m.group(1)] = m.group(3)
            continue
        m = re.match(r"^(/\S+) \(0x[0-9a-f]+\)$", line)  # the dynamic loader
        if m:
            libs[os.path.basename(m.group(1))] = m.group(1)
    return libs


def path_variants(path):
    """The names dpkg may know a library by: Debian 12 merged /lib into /usr/lib, and a
    package lists either spelling and either the soname link or the file behind it."""
    out = []
    for p in (path, os.path.realpath(path)):
        out.append(p)
        if p.startswith("/usr/"):
            out.append(p[len("/usr"):])
        else:
            out.append("/usr" + p)
    return list(dict.fromkeys(out))


@functools.lru_cache(maxsize=None)
def owning_package(path):
    """The Debian package that ships this library, or None."""
    rc, out, err = run(["dpkg", "-S"] + path_variants(path))
    for line in out.splitlines():
        if line.startswith("diversion "):
            continue
        m = re.match(r"^(.+?): (/.*)$", line)
        if m:
            return m.group(1).split(",")[0].strip().split(":")[0]
    return None


@functools.lru_cache(maxsize=None)
def installed_packages():
    """{package: (essential, [dependency groups], [provided names])} from dpkg's database."""
    rc, out, err = run(["dpkg-query", "-W", "-f",
                        "${Package}\t${Essential}\t${Pre-Depends}\t${Depends}\t${Provides}\n"])
    packages = {}
    for line in out.splitlines():
        name, essential, pre, dep, provides = (line.split("\t") + [""] * 5)[:5]
        groups = []
        for field in (pre, dep):
            for group in filter(None, (g.strip() for g in field.split(","))):
                groups.append([re.split(r"[\s:(]", alt.strip())[0] for alt in group.split("|")])
        provided = [re.split(r"[\s:(]", p.strip())[0] for p in provides.split(",") if p.strip()]
        packages[name] = (essential == "yes", groups, provided)
    return packages


@functools.lru_cache(maxsize=None)
def base_image_packages():
    """The packages every debian:12 image has: the Essential ones and apt, with everything
    they depend on. debian:12-slim is debootstrap's minbase (every Priority: required
    package plus apt), a superset of this, so a library whose package is in this set needs
    no apt-get install; anything else must be installed by the Dockerfile."""
    packages = installed_packages()
    providers = {}
    for name, (_, _, provided) in packages.items():
        for p in provided:
            providers.setdefault(p, []).append(name)
    todo = [n for n, (essential, _, _) in packages.items() if essential] + ["apt"]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in packages:
            continue
        seen.add(name)
        for group in packages[name][1]:
            for alt in group:
                todo.extend([alt] if alt in packages else providers.get(alt, []))
    return seen


def check_libraries(report, dockerfile, binaries, stage_packages, what):
    """Every library the binaries load comes from a Debian package the stage installs or
    the base image has. This proves the runtime image can load the binaries as they were
    built here (Debian 12, same packages as the build stage); it cannot see libraries
    loaded with dlopen (the GPU drivers), which the image does not carry."""
    base = base_image_packages()
    for binary in binaries:
        libs = ldd(binary)
        if not report.expect(libs is not None, dockerfile, what, f"ldd {binary} failed"):
            continue
        for soname, path in sorted(libs.items()):
            if soname.startswith("libtensord"):
                continue  # built by this project: the client stage copies it
            if not report.expect(path is not None, dockerfile, what,
                                 f"{os.path.basename(binary)} needs {soname}, which ldd "
                                 "cannot find here"):
                continue
            package = owning_package(path)
            if not report.expect(package is not None, dockerfile, what,
                                 f"{os.path.basename(binary)} loads {path}, which no Debian "
                                 "package owns (dpkg -S)"):
                continue
            report.expect(package in base or package in stage_packages, dockerfile, what,
                          f"{os.path.basename(binary)} loads {soname} from package {package}, "
                          "which the stage does not install and debian:12-slim lacks")


# -------------------------------------------------------------------------- Dockerfile


@dataclasses.dataclass
class Instruction:
    keyword: str
    rest: str
    line: int


@dataclasses.dataclass
class Stage:
    name: str
    base: str
    line: int
    instructions: list


def parse_dockerfile(text):
    """Stages with their instructions; continuation lines joined, comments dropped (as
    Docker does inside a continued instruction too)."""
    stages = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        keyword, _, rest = whole.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].lower() == "as" else str(len(stages))
            stages.append(Stage(name, parts[0], start, []))
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, rest, start))
    return stages


def exec_form(rest):
    """The argv of a JSON (exec) form, or None for the shell form."""
    try:
        value = json.loads(rest)
    except ValueError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def split_flags(rest):
    """('--from=x' style flags, the rest as written) of a COPY or HEALTHCHECK line."""
    flags = {}
    while True:
        m = re.match(r"--([\w-]+)(?:=(\S*))?\s*", rest)
        if not m:
            return flags, rest
        flags[m.group(1)] = m.group(2) or ""
        rest = rest[m.end():]


def apt_packages(run_text):
    """Packages named by `apt-get install` in a RUN line."""
    packages = []
    for command in re.split(r"&&|;|\|\|", run_text):
        tokens = shlex.split(command)
        if len(tokens) >= 2 and tokens[0] == "apt-get" and "install" in tokens:
            after = tokens[tokens.index("install") + 1:]
            packages += [t for t in after if not t.startswith("-")]
    return packages


def stage_chain(stages, name):
    """The stage and the stages it is built FROM, nearest first."""
    by_name = {s.name: s for s in stages}
    chain = []
    while name in by_name and by_name[name] not in chain:
        chain.append(by_name[name])
        name = by_name[name].base
    return chain


def stage_env(stages, name):
    env = {}
    for stage in reversed(stage_chain(stages, name)):
        for ins in stage.instructions:
            if ins.keyword == "ENV":
                tokens = shlex.split(ins.rest)
                if tokens and "=" in tokens[0]:
                    env.update(t.split("=", 1) for t in tokens)
                elif tokens:
                    env[tokens[0]] = " ".join(tokens[1:])
    return env


def last_instruction(stages, name, keyword):
    for stage in stage_chain(stages, name):
        found = [i for i in stage.instructions if i.keyword == keyword]
        if found:
            return found[-1]
    return None


@dataclasses.dataclass
class Daemon:
    """What the Dockerfile says about the daemon; other files are compared with it."""
    uid: int = None
    gid: int = None
    group: str = None
    entrypoint: list = None
    socket: str = None
    version: str = None


def check_dockerfile(report, repo, path, daemon, binaries, libs):
    text = open(path).read()
    stages = parse_dockerfile(text)
    names = [s.name for s in stages]
    report.expect(len(stages) >= 2, path, "FROM", "needs a build stage and a runtime stage")
    build = next((s for s in stages if s.name == "build"), None)
    if report.expect(build is not None, path, "FROM ... AS build", "no stage named build"):
        report.expect(build.base == "debian:12", path, "FROM ... AS build",
                      f"builds on {build.base}, not debian:12 (the packages are Debian 12's)")
    final = stages[-1] if stages else None
    report.expect(final is not None and final.name == "tensord", path, "last stage",
                  "the last stage (what a plain `docker build` makes) must be the daemon, "
                  f"named tensord; stages are {names}")
    for stage in stages:
        chain = stage_chain(stages, stage.name)
        root = chain[-1].base if chain else stage.base
        if stage.name != "build":
            report.expect(root == "debian:12-slim", path, f"stage {stage.name}",
                          f"runs on {root}, not debian:12-slim")

    # COPY sources: the build context is the repository root.
    copied = set()
    for stage in stages:
        for ins in stage.instructions:
            if ins.keyword not in ("COPY", "ADD"):
                continue
            flags, rest = split_flags(ins.rest)
            argv = exec_form(rest) or shlex.split(rest)
            sources = argv[:-1]
            report.expect(len(argv) >= 2, path, f"line {ins.line} {ins.keyword}",
                          "needs a source and a destination")
            if "from" in flags:
                report.expect(flags["from"] in names, path, f"line {ins.line} COPY --from",
                              f"no stage named {flags['from']}")
                continue
            for src in sources:
                copied.add(os.path.normpath(src))
                report.expect(os.path.exists(os.path.join(repo, src)), path,
                              f"line {ins.line} {ins.keyword} {src}",
                              "does not exist in the repository (the build context)")

    # .dockerignore: sends the builder nothing but what COPY takes (and never .git or a build
    # folder), and keeps everything COPY takes.
    # The build context's root, where .dockerignore lives: deploy/docker/Dockerfile's
    # grandparent (the repository, or the self-test's copy).
    ignore_path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(path))), ".dockerignore")
    if report.expect(os.path.exists(ignore_path), ignore_path, "the file",
                     "is missing: the builder would be sent the whole checkout"):
        with open(ignore_path) as f:
            rules = [line.strip() for line in f if line.strip() and not line.startswith("#")]
        kept = {os.path.normpath(r[1:]) for r in rules if r.startswith("!")}
        report.expect(rules[:1] == ["*"], ignore_path, "first rule",
                      "is not `*`: the builder would be sent what no COPY takes")
        for src in sorted(copied):
            report.expect(src in kept, ignore_path, f"COPY source {src}",
                          "is not kept by a `!` rule: the build would not find it")
        for extra in sorted(kept - copied):
            report.expect(False, ignore_path, f"`!{extra}`", "sends a path no COPY takes")

    run_text = " ".join(i.rest for s in stages if s.name == "build" for i in s.instructions
                        if i.keyword == "RUN")
    report.expect("deploy/install-deps.sh" in run_text, path, "build stage RUN",
                  "does not run deploy/install-deps.sh")
    configure = re.search(r"cmake -S \S+ -B [^&]*", run_text)
    if report.expect(configure is not None, path, "build stage RUN", "no `cmake -S ... -B ...`"):
        options = configure.group(0)
        report.expect("-G Ninja" in options, path, "cmake configure", "not -G Ninja")
        report.expect("-DCMAKE_BUILD_TYPE=Release" in options, path, "cmake configure",
                      "not -DCMAKE_BUILD_TYPE=Release")
        # The folders the top-level CMakeLists.txt configures must be in the image.
        top = open(os.path.join(repo, "CMakeLists.txt")).read()
        needed = set(re.findall(r"add_subdirectory\((\w+)\)", top))
        needed |= {os.path.normpath(p) for p in re.findall(r"include\(([\w/]+\.cmake)\)", top)}
        if "-DTENSORD_BUILD_TESTS=OFF" in options:
            needed.discard("tests")
        for folder in sorted(needed):
            report.expect(any(folder == c or folder.startswith(c + "/") for c in copied), path,
                          "COPY", f"CMakeLists.txt needs {folder}, which is not copied")
    targets = re.search(r"--target((?: [\w-]+)+)", run_text)
    if report.expect(targets is not None, path, "cmake --build", "no --target list"):
        listed = targets.group(1).split()
        for want in ("tensord", "tensorctl"):
            report.expect(want in listed, path, "cmake --build --target", f"does not build {want}")
        sources = ""
        for folder in ("server", "client"):
            for dirpath, _, files in os.walk(os.path.join(repo, folder)):
                if "CMakeLists.txt" in files:
                    sources += open(os.path.join(dirpath, "CMakeLists.txt")).read()
        defined = set(re.findall(r"(?:add_executable|add_library|pybind11_add_module)\((\w+)",
                                 sources))
        for target in listed:
            report.expect(target in defined, path, "cmake --build --target",
                          f"{target} is not a target of server/ or client/")

    # The tensord user and group.
    for ins in (i for s in stages for i in s.instructions if i.keyword == "RUN"):
        m = re.search(r"groupadd (?:--system )?--gid (\d+) (\w+)", ins.rest)
        if m:
            daemon.gid, daemon.group = int(m.group(1)), m.group(2)
        m = re.search(r"useradd .*--uid (\d+) --gid (\d+)", ins.rest)
        if m:
            daemon.uid = int(m.group(1))
            report.expect(int(m.group(2)) == daemon.gid, path, "useradd --gid",
                          f"{m.group(2)} is not the groupadd gid {daemon.gid}")
    report.expect(daemon.uid is not None, path, "useradd", "no `useradd ... --uid N --gid N`")
    report.expect(daemon.gid is not None, path, "groupadd", "no `groupadd --gid N NAME`")
    for stage in stages:
        if stage.name in ("tensord", "client"):
            user = last_instruction(stages, stage.name, "USER")
            report.expect(user is not None and user.rest == f"{daemon.uid}:{daemon.gid}", path,
                          f"stage {stage.name} USER",
                          f"{user.rest if user else 'none'}, not {daemon.uid}:{daemon.gid} (numeric, "
                          "so Kubernetes can tell it is not root)")

    # The daemon stage: ENTRYPOINT, VOLUME, socket directory, HEALTHCHECK.
    if final is None:
        return stages
    entry = last_instruction(stages, final.name, "ENTRYPOINT")
    argv = exec_form(entry.rest) if entry else None
    if report.expect(argv is not None, path, "ENTRYPOINT",
                     "must be the exec (JSON) form: in the shell form sh is pid 1 and "
                     "SIGTERM never reaches tensord"):
        daemon.entrypoint = argv
        report.expect(os.path.basename(argv[0]) == "tensord", path, "ENTRYPOINT",
                      f"runs {argv[0]}, not tensord")
        check_installed(report, path, stages, final.name, argv[0])
        daemon.socket = option_value(argv, "--socket")
        report.expect(daemon.socket is not None, path, "ENTRYPOINT", "no --socket")
        group = option_value(argv, "--socket-group")
        report.expect(group in (daemon.group, str(daemon.gid)), path, "ENTRYPOINT --socket-group",
                      f"{group} is not the group the Dockerfile makes ({daemon.group}, "
                      f"gid {daemon.gid})")
        env = stage_env(stages, final.name)
        check_tensord_command(report, path, "ENTRYPOINT", argv, env, daemon, binaries)
    volume = last_instruction(stages, final.name, "VOLUME")
    volumes = (exec_form(volume.rest) or volume.rest.split()) if volume else []
    if daemon.socket:
        socket_dir = posixpath.dirname(daemon.socket)
        report.expect(socket_dir in volumes, path, "VOLUME",
                      f"{volumes} does not hold the socket directory {socket_dir}")
        made = re.search(r"install -d -o (\d+) -g (\d+) -m (0\d+) (\S+)",
                         " ".join(i.rest for i in final.instructions if i.keyword == "RUN"))
        if report.expect(made is not None, path, "stage tensord RUN",
                         "does not make the socket directory (install -d -o UID -g GID -m MODE)"):
            report.expect(made.group(4) == socket_dir, path, "install -d",
                          f"makes {made.group(4)}, not the socket directory {socket_dir}")
            report.expect((int(made.group(1)), int(made.group(2))) == (daemon.uid, daemon.gid),
                          path, "install -d -o/-g",
                          f"{made.group(1)}:{made.group(2)}, not {daemon.uid}:{daemon.gid}: "
                          "the daemon could not create its socket there")
            report.expect(int(made.group(3), 8) & 0o022 == 0, path, "install -d -m",
                          f"{made.group(3)}: clients refuse a socket directory others can write")
        env = stage_env(stages, final.name)
        report.expect(env.get("TENSORD_SOCKET") == daemon.socket, path, "ENV TENSORD_SOCKET",
                      f"{env.get('TENSORD_SOCKET')}, not the --socket {daemon.socket}")
        health = last_instruction(stages, final.name, "HEALTHCHECK")
        if report.expect(health is not None, path, "HEALTHCHECK", "none (compose waits on it)"):
            _, rest = split_flags(health.rest)
            kind, _, command = rest.partition(" ")
            hargv = exec_form(command) if kind == "CMD" else None
            if report.expect(hargv is not None, path, "HEALTHCHECK", "not CMD in the exec form"):
                check_installed(report, path, stages, final.name, hargv[0])
                check_tensorctl_command(report, path, "HEALTHCHECK", hargv, daemon, binaries,
                                        want="health")

    # Runtime packages: the daemon stage serves tensord and tensorctl; the client stage
    # also libtensord and the Python module (--lib).
    for stage in stages:
        if stage.name not in ("tensord", "client"):
            continue
        packages = set()
        for s in stage_chain(stages, stage.name):
            for ins in s.instructions:
                if ins.keyword == "RUN":
                    packages.update(apt_packages(ins.rest))
        for package in sorted(packages):
            report.expect(package in installed_packages(), path, f"stage {stage.name} apt-get install",
                          f"{package} is not a Debian 12 package installed here (a typo?)")
        wanted = [binaries.tensord, binaries.tensorctl] if stage.name == "tensord" else \
            [binaries.tensorctl] + list(libs)
        check_libraries(report, path, wanted, packages, f"stage {stage.name} packages")
    return stages


def check_installed(report, path, stages, stage, program):
    """The program is where a COPY of the stage (or of a stage it is built on) put it."""
    placed = set()
    for s in stage_chain(stages, stage):
        for ins in (i for i in s.instructions if i.keyword == "COPY"):
            _, rest = split_flags(ins.rest)
            *sources, dest = exec_form(rest) or shlex.split(rest) or [""]
            if dest.endswith("/"):
                placed.update(dest + posixpath.basename(src.rstrip("/")) for src in sources)
            else:
                placed.add(dest)
    report.expect(program in placed, path, f"stage {stage}",
                  f"runs {program}, which no COPY of the stage puts there")


def option_value(argv, option):
    for i, token in enumerate(argv):
        if token == option and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(option + "="):
            return token.split("=", 1)[1]
    return None


# ------------------------------------------------------------------ command lines


@dataclasses.dataclass
class Binaries:
    tensord: str
    tensorctl: str


def check_tensord_command(report, path, field, argv, env, daemon, binaries):
    """Flags known to `tensord --help`; the whole line accepted by `tensord --print-config`.
    Returns the effective configuration ({key: value}) or None."""
    help_ = read_help(binaries.tensord)
    if not report.expect(help_ is not None, path, field, f"{binaries.tensord} --help failed"):
        return None
    # An unknown flag is reported here and left out of the --print-config run below, so
    # the rest of the line is still checked.
    args = []
    rest = list(argv[1:])
    while rest:
        token = rest.pop(0)
        flag = token.split("=", 1)[0]
        if token.startswith("--") and not report.expect(
                flag in help_.flags, path, field, f"tensord has no flag {flag} (not in tensord --help)"):
            if "=" not in token and rest and not rest[0].startswith("--"):
                rest.pop(0)  # its value
            continue
        args.append(token)
    # The group exists inside the image only (checked above against groupadd); here a
    # group that exists on this machine stands in for it.
    for i, token in enumerate(args[:-1]):
        if token == "--socket-group":
            args[i + 1] = str(os.getgid())
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TENSORD_")}
    clean.update({k: v for k, v in env.items() if k.startswith("TENSORD_")})
    rc, out, err = run([binaries.tensord, "--print-config"] + args, env=clean)
    if not report.expect(rc == 0, path, field,
                         f"tensord refuses this command line: {err.strip() or out.strip()}"):
        return None
    config = {}
    for line in out.splitlines():
        m = re.match(r'^(\w+) = ("[^"]*"|\d+)', line)
        if m:
            config[m.group(1)] = json.loads(m.group(2))
    return config


def check_tensorctl_command(report, path, field, argv, daemon, binaries, want=None):
    ok = report.expect(os.path.basename(argv[0]) == "tensorctl", path, field,
                       f"runs {argv[0]}, not tensorctl")
    top = read_help(binaries.tensorctl)
    if not report.expect(top is not None, path, field, f"{binaries.tensorctl} --help failed"):
        return
    sub, i = None, 1
    while i < len(argv):
        token = argv[i]
        if token.startswith("-"):
            i += 2 if top.flags.get(token.split("=", 1)[0]) and "=" not in token else 1
            continue
        sub = token
        break
    if not report.expect(sub is not None, path, field, "no tensorctl subcommand"):
        return
    if want:
        report.expect(sub == want, path, field, f"runs tensorctl {sub}, not tensorctl {want}")
    if not report.expect(sub in top.subcommands, path, field,
                         f"tensorctl has no subcommand {sub} (not in tensorctl --help)"):
        return
    sub_help = read_help(binaries.tensorctl, sub)
    flags = dict(top.flags, **(sub_help.flags if sub_help else {}))
    for token in argv[1:]:
        if token.startswith("-"):
            flag = token.split("=", 1)[0]
            report.expect(flag in flags, path, field,
                          f"tensorctl {sub} has no flag {flag} (not in its --help)")
    socket = option_value(argv, "--socket")
    if daemon.socket and ok:
        report.expect(socket == daemon.socket, path, f"{field} --socket",
                      f"{socket}, not the daemon's socket {daemon.socket}")


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
    env = {e.get("name"): e.get("value") for e in main.get("env") or []}
    report.expect(bool(argv) and os.path.basename(argv[0]) == "tensord", path, f"{cf}.command",
                  "does not run tensord")
    config = check_tensord_command(report, path, f"{cf}.command+args", argv, env, daemon, binaries)
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
                    "tests/deploy/check_deploy.py"):
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


def self_test(repo, deploy, docs, binaries, libs):
    """Breaks copies of the files one way at a time; each break must make a new check fail."""
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
        return 0 if self_test(repo, deploy, docs, binaries, libs) else 1
    report = run_checks(repo, deploy, docs, binaries, libs)
    for failure in report.failures:
        print(f"FAIL {failure}")
    print(f"deploy checks: {report.passed} passed, {len(report.failures)} failed")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
