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
echo "install_test: OK"
