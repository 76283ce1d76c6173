#!/usr/bin/env bash
# Installs tensord from the build tree into a temporary prefix, builds a separate consumer
# project against it with find_package(tensord), and runs it against the installed daemon.
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
daemon_pid=
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
# client.h with types.h and, beside them, the ABI headers they include (abi/include in the source tree).
for header in client.h types.h dlpack.h status.h; do
  test -f "$work/prefix/include/tensord/$header"
done
# The installed headers name no gRPC, protobuf or absl type.
if grep -rlE '#include.*(grpc|google/protobuf|absl)|(grpc|absl|google::protobuf)::' "$work/prefix/include/tensord"; then
  echo "install_test: installed headers mention gRPC/protobuf/absl" >&2
  exit 1
fi
cmake -S "$source_dir/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null

export TENSORD_SOCKET="$work/run/tensord.sock"
mkdir -p "$work/run"
"$work/prefix/bin/tensord" --log-level warn &
daemon_pid=$!
for _ in $(seq 200); do [ -S "$TENSORD_SOCKET.fd" ] && break; sleep 0.05; done
"$work/consumer/consumer"
"$work/prefix/bin/tensorctl" --json stat demo/matrix | grep -q '"name"'

# The Python package, when this build has it: installed where Debian's python3 looks under
# both /usr and /usr/local (not /usr/local/lib/python3/dist-packages, which it skips), and
# importable from there, reading what the consumer published.
module=$(find "$work/prefix" -name '_tensord*.so' -print -quit)
if [ -n "$module" ]; then
  package_dir=$(dirname "$(dirname "$module")")
  relative=${package_dir#"$work/prefix/"}
  /usr/bin/python3 - "$relative" <<'PY'
import sys
relative = sys.argv[1]
for prefix in ("/usr", "/usr/local"):
    if f"{prefix}/{relative}" not in sys.path:
        sys.exit(f"install_test: the Python package goes to <prefix>/{relative}, which "
                 f"/usr/bin/python3 does not search under {prefix} (sys.path: {sys.path})")
PY
  PYTHONPATH="$package_dir" /usr/bin/python3 - "$package_dir" <<'PY'
import sys
import tensord
if not tensord.__file__.startswith(sys.argv[1]):
    sys.exit(f"install_test: imported {tensord.__file__}, not the installed package")
t = tensord.connect().get("demo/matrix", timeout=5.0)
if t.nbytes == 0:
    sys.exit("install_test: demo/matrix read through the installed package is empty")
PY
fi
echo "install_test: OK"
