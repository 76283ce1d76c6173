"""What the built binaries say: their --help, the shared libraries they load (ldd) and the
Debian packages that ship them (dpkg), and whether a tensord or tensorctl command line in the
deploy files is one they accept.
"""

import dataclasses
import functools
import json
import os
import re

from deploy_common import run

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
