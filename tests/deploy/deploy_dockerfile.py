"""The Dockerfile: parsed into stages and instructions, and checked against the repository
(COPY sources, .dockerignore, the folders and targets the build needs), the built binaries
(ENTRYPOINT and HEALTHCHECK command lines, the libraries the runtime stages must install)
and itself (the tensord user and group, the socket directory, the volume). What it says about
the daemon (Daemon) is what the other files are compared with.
"""

import dataclasses
import json
import os
import posixpath
import re
import shlex

from deploy_binaries import (check_libraries, check_tensorctl_command, check_tensord_command,
                             installed_packages, option_value)

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
