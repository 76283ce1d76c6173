"""The READMEs' snippets run as written.

Every ```python block of README.md and client/python/README.md runs, unchanged, in a fresh
Debian python3 (this interpreter, /usr/bin/python3 under ctest) from the repository root,
against a test daemon of its own ($TENSORD_SOCKET points at it, as for any child process
here), with a time limit: a snippet that blocks fails instead of hanging the suite.

docs/cpp-api.md's ```cpp block is a whole program. It is compiled as written against the source
tree's public headers (client/include, and abi/include for the tensord/dlpack.h and
tensord/status.h that client.h includes) and the build tree's libtensord.so with -Wall
-Wextra -Wpedantic -Werror (an ignored [[nodiscard]] result is an error), then run against a
test daemon.

A block that is deliberately not run is preceded by the line

    <!-- not run: <reason> -->

(an HTML comment: Markdown renderers do not show it); it is reported as skipped with its
reason. Keep them rare: a snippet nobody runs is a snippet that rots.

Blocks in other languages (sh, cmake, toml) are not run here: they start daemons on fixed
paths, build trees or wait for Ctrl-C, and are checked by hand.

The compiler is $TENSORD_CXX (ctest passes CMAKE_CXX_COMPILER), else c++; libtensord.so is
found in $TENSORD_LIB_DIR (ctest sets it), else in the build tree beside $TENSORD_BIN
(<build>/server/tensord -> <build>/client).
"""

import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
READMES = ["README.md", os.path.join("client", "python", "README.md")]
CPP_DOC = os.path.join("docs", "cpp-api.md")  # the C++ API's page: one whole program

_FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->\s*$")


def blocks(path, language):
    """(line, code, not_run_reason or None) for each ```language block of path."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        text = f.read()
    found = []
    for m in _FENCE.finditer(text):
        if m.group(1) != language:
            continue
        line = text.count("\n", 0, m.start()) + 1
        preceding = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _NOT_RUN.search(preceding)
        found.append((line, m.group(2), marker.group(1) if marker else None))
    return found


def _params(language, paths):
    params = []
    for path in paths:
        for line, code, reason in blocks(path, language):
            marks = [pytest.mark.skip(reason=f"not run: {reason}")] if reason else []
            params.append(pytest.param(code, id=f"{path}:{line}", marks=marks))
    return params


def test_the_readmes_have_the_snippets_this_file_runs():
    # A renamed fence or a moved file would otherwise leave nothing to run, silently.
    for path in READMES:
        assert blocks(path, "python"), f"no ```python block in {path}"
    assert len(blocks(CPP_DOC, "cpp")) == 1, f"{CPP_DOC} should hold one ```cpp program"


@pytest.mark.parametrize("code", _params("python", READMES))
def test_python_snippet_runs(broker, code):
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=broker.env(),
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the snippet did not finish in 120 s (it blocks?):\n{code}")
    assert done.returncode == 0, f"the snippet failed:\n{code}\n--- stderr:\n{done.stderr}"


def _lib_dir():
    lib_dir = os.environ.get("TENSORD_LIB_DIR")
    if not lib_dir:
        build = os.path.dirname(os.path.dirname(os.path.abspath(os.environ["TENSORD_BIN"])))
        lib_dir = os.path.join(build, "client")
    if not os.path.exists(os.path.join(lib_dir, "libtensord.so")):
        pytest.fail(f"no libtensord.so in {lib_dir}: build tensord_client (or tensord_python), "
                    "or set TENSORD_LIB_DIR")
    return lib_dir


@pytest.mark.parametrize("code", _params("cpp", [CPP_DOC]))
def test_cpp_snippet_compiles_without_warnings_and_runs(broker, tmp_path, code):
    source = tmp_path / "readme_snippet.cc"
    source.write_text(code)
    program = tmp_path / "readme_snippet"
    lib_dir = _lib_dir()
    compile_cmd = [
        os.environ.get("TENSORD_CXX", "c++"), "-std=c++20", "-Wall", "-Wextra", "-Wpedantic",
        "-Werror", "-I", os.path.join(REPO, "client", "include"),
        "-I", os.path.join(REPO, "abi", "include"), str(source), "-o",
        str(program), "-L", lib_dir, "-ltensord", f"-Wl,-rpath,{lib_dir}",
    ]
    built = subprocess.run(compile_cmd, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, (
        f"docs/cpp-api.md's C++ program does not compile cleanly:\n{' '.join(compile_cmd)}\n"
        f"{built.stderr}")
    try:
        ran = subprocess.run([str(program)], cwd=tmp_path, env=broker.env(),
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("docs/cpp-api.md's C++ program did not finish in 60 s")
    assert ran.returncode == 0, f"docs/cpp-api.md's C++ program failed:\n{ran.stdout}{ran.stderr}"
