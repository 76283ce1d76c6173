#!/usr/bin/env bash
# The deployments of deploy/ run for real, as root on a Debian 12 machine (`tests/run_all.sh
# deploy` runs this; not part of the default `.ci/run`, see README.md):
#
#   packages    Debian's docker.io, debootstrap, docker-compose and python3-kubernetes,
#               installed when missing
#   k8s         the manifests checked field by field against the Kubernetes API schema of
#               Debian's python3-kubernetes, and that check's own self-test
#   build       the host's build of tensord, tensorctl and the Python module (BUILD_DIR):
#               the host client reads through it, and systemd runs its `cmake --install`
#   engine      dockerd started by hand when none answers
#   base-image  debian:12 and debian:12-slim made with debootstrap and `docker import`
#               (no registry is needed), once: later runs reuse them
#   images      the Dockerfile's daemon and client images, with BuildKit
#   containers  a daemon container and client containers and a host client sharing a tensor
#               (same bytes, same memfd, same physical pages), health check, `docker stop`
#   compose     deploy/docker/compose.yaml with Debian's docker-compose
#   systemd     deploy/systemd's units under systemd as PID 1 of a container, installed as
#               docs/deployment.md says after `cmake --install` of the build
#
# Each step writes LOG_DIR/NN-step.log; summary.txt says what passed, in how long, on what.
# A failed step ends the run (later steps need what it makes), except k8s, which stands
# alone. Copy a run's folder to docs/deploy-runs/ to keep it.
#
# Usage: tests/deploy/live/run.sh [LOG_DIR]   (default build-deploy/<UTC date>-<commit>)
# Environment: DOCKER (default /usr/bin/docker, Debian's client), DEBIAN_MIRROR (default
#              http://deb.debian.org/debian), BUILD_DIR (the build to install under
#              systemd, default build; its tensord, tensorctl and Python module are built),
#              TENSORD_DEPLOY_STEPS (the steps to run, by name, e.g. "engine systemd-image
#              systemd" while working on the units; default: all)
set -euo pipefail
cd "$(dirname "$0")/../../.."
repo=$PWD
live=$repo/tests/deploy/live
docker=${DOCKER:-/usr/bin/docker}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
build_dir=${BUILD_DIR:-build}
commit=$(git describe --always --dirty 2>/dev/null || echo unknown)
log_dir=${1:-build-deploy/$(date -u +%Y-%m-%d)-$commit}
mkdir -p "$log_dir"
log_dir=$(cd "$log_dir" && pwd)
# Debian's client and tools first: another docker client earlier on PATH (a newer one without
# buildx) would fall back to the legacy builder.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
export DOCKER_BUILDKIT=1
python=/usr/bin/python3

if [ "$(id -u)" -ne 0 ]; then
  echo "deploy: run as root (it installs packages, starts dockerd and reads /proc/PID/pagemap)" >&2
  exit 1
fi

summary=$log_dir/summary.txt
{
  echo "tensord deploy run: commit $commit, started $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -srm); $(. /etc/os-release && echo "$PRETTY_NAME"); $(nproc) CPUs"
} > "$summary"

step_number=0
# step NAME COMMAND...: runs the command with its output in LOG_DIR/NN-NAME.log and on the
# console, records the result, and sets step_rc to the command's status. It returns 0: a
# caller that tested its status (`step ... || ...`) would turn errexit off inside it.
step() {
  local name=$1
  shift
  step_number=$((step_number + 1))
  local log
  log=$log_dir/$(printf '%02d' "$step_number")-$name.log
  local started rc
  started=$(date +%s)
  echo "== deploy step $name: start $(date -u +%H:%M:%S)" | tee "$log"
  set +e
  ( set -e; "$@" ) 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  set -e
  local took=$(($(date +%s) - started))
  local result=passed
  [ "$rc" -eq 0 ] || result="FAILED (exit $rc)"
  echo "== deploy step $name: $result in ${took} s" | tee -a "$log"
  printf '%-13s %-16s %5d s  %s\n' "$name" "$result" "$took" "$(basename "$log")" >> "$summary"
  step_rc=$rc
}

k8s() {
  "$python" "$live/k8s_schema.py" deploy/k8s/*.yaml
  "$python" "$live/k8s_schema.py" --self-test deploy/k8s/daemonset.yaml
}

packages() {
  local missing=()
  for p in docker.io debootstrap docker-compose python3-kubernetes python3-yaml python3-numpy; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "every package is installed"
    return
  fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

engine() {
  if ! "$docker" info >/dev/null 2>&1; then
    # No init system starts it where systemd is not PID 1 (containers, some VMs): by hand.
    # Its log stays beside the run's.
    echo "starting dockerd (log: $log_dir/dockerd.log)"
    setsid dockerd >"$log_dir/dockerd.log" 2>&1 < /dev/null &
    for _ in $(seq 60); do "$docker" info >/dev/null 2>&1 && break; sleep 1; done
  fi
  "$docker" version
  "$docker" info 2>/dev/null | grep -E 'Server Version|Storage Driver|Cgroup|Kernel Version|Operating System'
  docker-compose version
}

images() {
  local args=(-f deploy/docker/Dockerfile --build-arg "TENSORD_COMMIT=$commit")
  "$docker" build --progress=plain "${args[@]}" -t tensord:0.1.0 .
  "$docker" build --progress=plain "${args[@]}" --target client -t tensord-client:0.1.0 .
  "$docker" build --progress=plain "${args[@]}" --target runtime-base \
    -t tensord-runtime-base:deploy-test .
  "$docker" image ls --format '{{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' | grep '^tensord'
  "$docker" run --rm tensord:0.1.0 --version
}

containers() {
  "$python" "$live/containers.py" --docker "$docker" --live-dir "$live" \
    --python-path "$repo/$build_dir/python"
}

compose() {
  # The images step's build argument, so compose reuses its layers instead of building
  # again for another `tensord --version` string.
  TENSORD_COMMIT=$commit "$python" "$live/compose.py" --docker "$docker" --compose docker-compose --file deploy/docker/compose.yaml
}

build() {
  [ -f "$build_dir/CMakeCache.txt" ] || cmake -S . -B "$build_dir" -G Ninja
  cmake --build "$build_dir" --target tensord tensorctl tensord_python
}

systemd_image() {
  # What an operator has after building and `cmake --install` (prefix /usr/local, as the
  # units' ExecStart= expects), made into the image's tree with DESTDIR.
  local context
  context=$(mktemp -d /var/tmp/tensord-systemd-image.XXXXXX)
  DESTDIR=$context/staging cmake --install "$build_dir" --prefix /usr/local
  mkdir -p "$context/repo/deploy"
  cp -r deploy/systemd "$context/repo/deploy/systemd"
  cp "$live/tensor_peer.py" "$context/"
  find "$context/staging" -type f | sed "s|^$context/staging||" | sort
  "$docker" build --progress=plain -f "$live/systemd.Dockerfile" \
    -t tensord-systemd:deploy-test "$context"
  rm -rf "$context"
}

systemd() {
  "$python" "$live/systemd_units.py" --docker "$docker" --image tensord-systemd:deploy-test \
    --docs docs/deployment.md
}

wanted() { [ -z "${TENSORD_DEPLOY_STEPS:-}" ] || [[ " $TENSORD_DEPLOY_STEPS " == *" $1 "* ]]; }

failed=0
if wanted packages; then
  step packages packages
  [ "$step_rc" -eq 0 ] || { cat "$summary"; exit 1; }
fi
if wanted k8s; then
  step k8s k8s
  [ "$step_rc" -eq 0 ] || failed=1
fi
# Each of these needs what the one before it made: the first failure ends the chain.
for name in build engine base-image images containers compose systemd-image systemd; do
  wanted "$name" || continue
  case "$name" in
    base-image) step "$name" "$live/base_image.sh" "$docker" "$mirror" ;;
    systemd-image) step "$name" systemd_image ;;
    *) step "$name" "$name" ;;
  esac
  if [ "$step_rc" -ne 0 ]; then
    failed=1
    break
  fi
done
echo "finished $(date -u '+%Y-%m-%d %H:%M:%S UTC')" >> "$summary"
echo
cat "$summary"
exit "$failed"
