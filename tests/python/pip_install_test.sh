#!/usr/bin/env bash
# The package as a pip user gets it: a fresh venv of Debian's python3 (with its site
# packages, for numpy, torch, pytest and mypy), `pip install --no-build-isolation --no-index`
# of the source tree, then, from outside the source tree, the package's own checks and the
# Python tests that depend on how it is installed (the READMEs' snippets, the type stubs
# against the installed module, pickled clients in spawned workers, processes that fork and
# die) against the installed package; and `python3 -m build` to a wheel that carries
# libtensord.so.0 beside the module ($ORIGIN).
#
# With BUILD_DIR, setup.py packages that CMake build tree (TENSORD_BUILD_DIR) instead of
# making its own Release build: ctest passes its own tree, which it has just built, and whose
# package the whole Python suite already ran against. Without it, this is what a user's
# `pip install .` does, a build of its own (minutes on a 2-core machine).
#
#   tests/python/pip_install_test.sh SOURCE_DIR DAEMON [PYTHON [BUILD_DIR]]
set -euo pipefail
source_dir=$(cd "$1" && pwd)
daemon=$2
python=${3:-/usr/bin/python3}
if [ -n "${4:-}" ]; then
  export TENSORD_BUILD_DIR=$(cd "$4" && pwd)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH  # the installed package, never the build tree's

"$python" -m venv --system-site-packages "$work/venv"
py=$work/venv/bin/python
"$py" -m pip install --no-build-isolation --no-index --no-cache-dir "$source_dir"

cd "$work"
package=$("$py" -c 'import os, tensord; print(os.path.dirname(tensord.__file__))')
case $package in
  "$work/venv/"*) ;;
  *) echo "pip_install_test: tensord was imported from $package, not the venv" >&2; exit 1 ;;
esac
for f in libtensord.so.0 py.typed __init__.pyi _version.py; do test -f "$package/$f"; done
dynamic=$(readelf -d "$package"/_tensord*.so)  # whole, as the wheel's listing below
grep -Eq 'R(UN)?PATH.*\$ORIGIN' <<<"$dynamic"
if grep -Eq 'R(UN)?PATH: \[(.*:)?/' <<<"$dynamic"; then
  echo "pip_install_test: the module's RPATH names an absolute path of the build machine" >&2
  exit 1
fi
want=$(sed -nE 's/^project\(tensord VERSION ([0-9.]+).*/\1/p' "$source_dir/CMakeLists.txt")
test "$("$py" -c 'import tensord; print(tensord.__version__)')" = "$want"
test "$("$py" -m pip show tensord | sed -n 's/^Version: //p')" = "$want"

tests=(test_readme.py test_typing.py test_pickle.py test_lifetime.py)
TENSORD_BIN=$daemon TENSORD_CXX=${TENSORD_CXX:-c++} PYTHONDONTWRITEBYTECODE=1 \
  TENSORD_LIB_DIR=${TENSORD_LIB_DIR:-$(dirname "$daemon")/../client} \
  "$py" -m pytest -q -p no:cacheprovider -p no:hypothesispytest --rootdir="$source_dir/tests/python" \
    "${tests[@]/#/$source_dir/tests/python/}"

"$py" -m build --no-isolation --wheel --outdir "$work/dist" "$source_dir" >/dev/null
wheel=$(ls "$work"/dist/tensord-"$want"-*.whl)
# The listing whole first: `grep -q` leaves at its first match, and under pipefail the
# listing's broken pipe would fail the test.
listing=$("$py" -m zipfile -l "$wheel")
grep -q 'tensord/libtensord.so.0' <<<"$listing"
grep -q 'tensord/_tensord\.' <<<"$listing"
echo "pip_install_test: OK ($(basename "$wheel"))"
