"""The package's type stubs (tensord/__init__.pyi, py.typed) against the module, with Debian's
mypy (python3-mypy, installed by deploy/install-deps.sh): stubtest, the C++ methods' own
signatures, and mypy --strict on programs that use the API rightly and wrongly."""

import ast
import os
import site
import subprocess
import sys
import textwrap

import pytest

import tensord

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(os.path.abspath(tensord.__file__))
ROOT = os.path.dirname(PACKAGE)  # the directory tensord is imported from
STUB = os.path.join(PACKAGE, "__init__.pyi")

try:
    import mypy  # noqa: F401
except ImportError:
    pytest.skip("needs Debian's mypy (python3-mypy; deploy/install-deps.sh installs it)", allow_module_level=True)


def run(args, **kwargs):
    # An installed package mypy finds as pip put it (PEP 561, py.typed); a build tree's by MYPYPATH.
    env = dict(os.environ)
    if ROOT not in site.getsitepackages():
        env["MYPYPATH"] = ROOT
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env,
                          timeout=300, **kwargs)


def test_every_public_name_and_member_has_a_docstring():
    import inspect

    missing = []
    for name in tensord.__all__:
        obj = getattr(tensord, name)
        if isinstance(obj, (tuple, str)):
            continue  # DLPACK_VERSION: a value
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        for member, value in vars(obj).items():
            if member.startswith("_") and member not in ("__dlpack__", "__dlpack_device__"):
                continue
            doc = (value.__doc__ if isinstance(value, property) else getattr(value, "__doc__", None)) or ""
            # pybind11 writes the signature first: a docstring is what comes after it
            text = doc.split("\n", 1)[1] if doc.startswith(f"{member}(") and "\n" in doc else doc
            if doc.startswith(f"{member}(") and "\n" not in doc.strip():
                text = ""
            if not text.strip():
                missing.append(f"{name}.{member}")
    assert not missing, f"no docstring: {missing}"


def test_the_package_is_typed():
    assert os.path.exists(os.path.join(PACKAGE, "py.typed"))
    assert os.path.exists(STUB)


def test_stubtest_finds_the_stubs_and_the_module_alike(tmp_path):
    out = run(["mypy.stubtest", "tensord", "--allowlist", os.path.join(HERE, "stubtest_allowlist.txt"),
               "--mypy-config-file", os.devnull], cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def stub_methods(cls_name):
    tree = ast.parse(open(STUB).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    def names(f):
        star = [f"*{f.args.vararg.arg}"] if f.args.vararg else []
        return [a.arg for a in f.args.args[1:]] + star + [a.arg for a in f.args.kwonlyargs]
    return {f.name: names(f) for f in cls.body if isinstance(f, ast.FunctionDef)}


def parameter_names(inside):
    """The names in a pybind11 signature's parameter list (types may hold commas)."""
    names, depth, start = [], 0, 0
    for i, ch in enumerate(inside + ","):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            part = inside[start:i].strip()
            if part:
                names.append(part.split(":")[0].split("=")[0].strip())
            start = i + 1
    return names


def test_the_cpp_methods_take_what_the_stubs_say():
    # stubtest cannot read a pybind11 method's signature; pybind11 writes it first in __doc__.
    checked = 0
    for name, params in stub_methods("Tensor").items():
        doc = getattr(getattr(tensord.Tensor, name), "__doc__", None) or ""
        if not doc.startswith(f"{name}(self: "):
            continue  # a Python method (stubtest checked it) or one without a signature
        signature = doc.split("\n", 1)[0]
        inside = signature[len(name) + 1:signature.rindex(")")]
        runtime = parameter_names(inside)[1:]
        assert runtime == params, f"Tensor.{name}: the module takes {runtime}, the stub says {params}"
        checked += 1
    assert checked >= 4, "no pybind11 signature was found to compare"


GOOD = """
    import numpy as np
    import tensord

    def main() -> None:
        with tensord.connect("/run/tensord/tensord.sock", client_name="typed") as client:
            info = client.put("demo/x", np.zeros(3), tags={"k": "v"})
            generation: int = info["generation"]
            t = client.get("demo/x", timeout=None, min_generation=generation)
            shape: tuple[int, ...] = t.shape
            same: bool = t.dtype == np.float64 and t.device == "cpu"
            buf = client.empty((2, 2), "float32", ns="demo")
            client.publish(buf, "demo/y", wait=False, tags={"a": "b"})
            batch: list[tensord.Tensor] = client.take_many("demo/", 8, timeout=1.0, pinned=False)
            for event in client.watch("demo/", initial=True):
                print(event["kind"], shape, same, batch)
                break
            try:
                client.take("demo/", timeout=0.5)
            except tensord.Timeout as e:
                print(e.code, e.message)
"""

BAD = """
    import tensord

    client = tensord.connect()
    client.get("demo/x", timeout="soon")
    n: str = client.session_id
    client.publish(client.empty(3, "float32"), 7)
"""


def test_mypy_strict_passes_a_typed_program_and_catches_a_wrong_one(tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(textwrap.dedent(GOOD))
    bad.write_text(textwrap.dedent(BAD))
    # One run for both (mypy's start, numpy's stubs, is most of its time).
    out = run(["mypy", "--strict", "--no-incremental", "--config-file", os.devnull,
               "--ignore-missing-imports", "good.py", "bad.py"], cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert not [e for e in errors if e.startswith("good.py")], out.stdout
    assert len(errors) == 3, out.stdout
    assert 'Argument "timeout" to "get" of "Client" has incompatible type "str"' in out.stdout
    assert "Incompatible types in assignment" in out.stdout
    assert 'Argument 2 to "publish" of "Client" has incompatible type "int"' in out.stdout
