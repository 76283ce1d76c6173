"""Builds the tensord Python package with the project's CMake build, for the interpreter that
runs this (pyproject.toml says how to call it). The package's files come from the CMake
build tree (client/python: the .py files, the stubs, the generated _version.py and the
extension), and libtensord.so.0 goes beside the extension, which finds it by $ORIGIN.

TENSORD_CMAKE_ARGS adds arguments to the CMake configure step (say -DCMAKE_BUILD_TYPE=Debug).
TENSORD_BUILD_DIR packages an existing CMake build tree instead (one configured with the
Python module for this interpreter, as `cmake -S . -B build` is): it is brought up to date
and its package taken as it is, with no build of its own. The test suite packages its build
tree this way (tests/python/pip_install_test.sh). Without it, the checkout's own `build`
tree is used the same way when it matches (configured with the Python module for an
interpreter with this one's extension suffix, not instrumented), so `pip install .` after
the README's build compiles only what changed; TENSORD_REUSE_BUILD=0 asks for a build of
its own under build/pip instead. `pip install -v` shows CMake's progress.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def project_version():
    """The one version: CMakeLists.txt's project(tensord VERSION x.y.z)."""
    with open(os.path.join(HERE, "CMakeLists.txt")) as f:
        match = re.search(r"project\(tensord\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not match:
        sys.exit("setup.py: no `project(tensord VERSION ...)` in CMakeLists.txt")
    return match.group(1)


class BinaryDistribution(Distribution):
    """The wheel holds an extension: tagged for this interpreter and platform."""

    def has_ext_modules(self):
        return True


def cmake_cache(build_dir):
    """The NAME:TYPE=VALUE entries of build_dir's CMakeCache.txt as {NAME: VALUE}."""
    entries = {}
    with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
        for line in f:
            name, sep, value = line.rstrip("\n").partition("=")
            if sep and not line.startswith(("#", "//")):
                entries[name.partition(":")[0]] = value
    return entries


def matching_build_tree():
    """HERE/build, when it would give this interpreter's package (see the docstring); else None."""
    build_dir = os.path.join(HERE, "build")
    if os.environ.get("TENSORD_REUSE_BUILD", "1") == "0" or \
            not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        return None
    cache = cmake_cache(build_dir)
    if cache.get("TENSORD_BUILD_PYTHON", "").upper() not in ("ON", "TRUE", "1", "YES") or \
            cache.get("TENSORD_SANITIZER", ""):
        return None
    python = cache.get("TENSORD_PYTHON_EXECUTABLE", "")
    try:
        suffix = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                                capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return build_dir if suffix and suffix == sysconfig.get_config_var("EXT_SUFFIX") else None


class CMakeBuildPy(build_py):
    """build_py that runs the CMake build of the module and copies its package."""

    def run(self):
        prebuilt = os.environ.get("TENSORD_BUILD_DIR") or matching_build_tree()
        if prebuilt:
            print(f"setup.py: packaging the build tree {prebuilt}, brought up to date", flush=True)
            build_dir = os.path.abspath(prebuilt)
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                sys.exit(f"setup.py: TENSORD_BUILD_DIR={prebuilt} is not a configured CMake build tree")
        else:
            tag = sysconfig.get_config_var("SOABI") or f"py{sys.version_info[0]}{sys.version_info[1]}"
            build_dir = os.path.join(HERE, "build", "pip", tag)
            configure = ["cmake", "-S", HERE, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                         f"-DTENSORD_PYTHON_EXECUTABLE={sys.executable}", "-DTENSORD_BUILD_PYTHON=ON",
                         "-DTENSORD_BUILD_TESTS=OFF", "-DTENSORD_BUILD_BENCH=OFF"]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            configure += shlex.split(os.environ.get("TENSORD_CMAKE_ARGS", ""))
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                self.spawn(configure)
        self.spawn(["cmake", "--build", build_dir, "--target", "tensord_python",
                    "-j", str(os.cpu_count() or 2)])

        # The build tree's package has the wheel's layout (client/python/CMakeLists.txt): the
        # module, its .py files and stubs, and libtensord.so.0 beside the module as a link,
        # which the copy follows so the wheel carries the library itself.
        source = os.path.join(build_dir, "python", "tensord")
        target = os.path.join(self.build_lib, "tensord")
        if os.path.exists(target):
            shutil.rmtree(target)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        extension = self.extension_file(target)
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        if suffix and not extension.endswith(suffix):
            sys.exit(f"setup.py: {build_dir} built {extension} for another interpreter than "
                     f"{sys.executable} (which loads *{suffix})")
        library = os.path.join(target, "libtensord.so.0")
        if not os.path.isfile(library) or os.path.islink(library):
            sys.exit(f"setup.py: {source} has no libtensord.so.0 beside the module")
        needed = subprocess.run(["ldd", os.path.join(target, extension)],
                                capture_output=True, text=True).stdout
        if "libtensord.so.0 => not found" in needed:
            sys.exit("setup.py: the extension does not find libtensord.so.0 beside it: RPATH is not $ORIGIN")

    @staticmethod
    def extension_file(directory):
        return next(f for f in os.listdir(directory) if f.startswith("_tensord") and f.endswith(".so"))


# setuptools' own files (build/, egg-info) go under build/pip, beside the CMake build it runs.
os.makedirs(os.path.join(HERE, "build", "pip"), exist_ok=True)

setup(
    version=project_version(),
    distclass=BinaryDistribution,
    cmdclass={"build_py": CMakeBuildPy},
    packages=["tensord"],
    package_dir={"tensord": os.path.join("client", "python", "tensord")},
    options={"build": {"build_base": os.path.join("build", "pip", "setuptools")},
             "egg_info": {"egg_base": os.path.join("build", "pip")}},
    package_data={"tensord": ["*.so", "*.so.*", "*.pyi", "py.typed"]},
)
