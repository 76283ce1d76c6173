#!/usr/bin/env bash
# Installs what building and testing tensord needs on Debian 12, from Debian's own packages.
# Installs only what is missing; safe to run again. Needs root or sudo.
#
# Usage: install-deps.sh            what the build and the whole test suite need
#        install-deps.sh --build-only  only what building tensord, tensorctl, libtensord and
#                                   the Python module needs (the image's build stage,
#                                   deploy/docker/Dockerfile): no torch, no test tools
set -euo pipefail

build_packages=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libdlpack-dev libtomlplusplus-dev libcli11-dev
  # tensorctl's --json output (client/cli/json_output.h); header-only
  nlohmann-json3-dev
  # systemd's notify protocol and socket activation (server/daemon/systemd.h)
  libsystemd-dev
  # the daemon's allocator (server/CMakeLists.txt): many small messages per request
  libjemalloc-dev
  python3 python3-dev pybind11-dev
  # the level_zero backend's headers (the loader is opened at run time)
  libze-dev
  # UCX, the cluster's data path between nodes (server/cluster/); without it the daemon
  # is built without the cluster and refuses --cluster-etcd
  libucx-dev
)

test_packages=(
  git
  libgtest-dev libgmock-dev libbenchmark-dev
  # systemd-analyze checks deploy/systemd's units (tests/service)
  systemd
  python3-numpy python3-torch python3-pytest
  # the Python package's type stubs are checked with mypy and its stubtest (test_typing.py)
  python3-mypy
  # pip into a venv and wheels, with Debian's build tools (tests/python/pip_install_test.sh)
  python3-venv python3-pip python3-setuptools python3-wheel python3-build
  # the gRPC bytes-copy peer of the comparative benchmark (tests/bench/compare.py)
  python3-grpcio
  # YAML of the container and Kubernetes files (tests/deploy/check_deploy.py)
  python3-yaml
  # the etcd server the cluster tests start on ports of their own (tests/cluster). On a
  # machine booted with systemd the package also starts one on 127.0.0.1:2379: `systemctl
  # disable --now etcd` stops it; the tests do not use it. openssl makes their certificates.
  etcd-server openssl
  # ucx_perftest, the floor of the cluster's benchmark (tests/bench/cluster_bench.py)
  ucx-utils
  # network namespaces and veth pairs for the cluster's tests (ip), a slow link (tc)
  iproute2
  clang libfuzzer-14-dev
  # clang's sanitizer runtimes and FuzzedDataProvider.h (clang only recommends them), and
  # llvm-symbolizer for sanitizer reports: the fuzzing and sanitizer builds of tests/run_all.sh.
  libclang-rt-14-dev llvm
  procps util-linux
)

packages=("${build_packages[@]}")
case "${1:-}" in
  "") packages+=("${test_packages[@]}") ;;
  --build-only) ;;
  *) echo "install-deps: unknown option '$1' (usage: install-deps.sh [--build-only])" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: everything is installed"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
