#!/usr/bin/env bash
# Builds and runs tensord's whole test suite, stage by stage:
#   deps   deploy/install-deps.sh (Debian packages only)
#   build  build/       the default build (-O2 -g1); every ctest test (unit, integration,
#                       install, python, pip, service, deploy, load, bench smoke runs)
#   asan   build-asan/  TENSORD_SANITIZER=address (ASan+UBSan, -O1 -g1): every test binary
#                       but the load test and the GPU-only ones
#   tsan   build-tsan/  clang, TENSORD_SANITIZER=thread (-O1 -g1): the same binaries
#   fuzz   build-fuzz/  clang, TENSORD_BUILD_FUZZERS: a bounded run of every fuzzer and a
#                       replay of the saved regressions (ctest label `fuzz`)
#   deploy build/ and a Docker engine: deploy/'s images, compose file and systemd units run
#                       for real (tests/deploy/live/run.sh, as root); only when named, never
#                       by default: it installs docker.io and starts dockerd, and takes about
#                       12 minutes on 2 cores from nothing cached, 3 once its images are
#                       (docs/deploy-runs)
# The sanitizer stages build only what their ctest runs (the `tensord_tests` target), so no
# binary is built there and left unrun. The clang stages (tsan, fuzz) also check the lock
# annotations (ABSL_GUARDED_BY and friends) at compile time: the top-level CMakeLists.txt
# adds -Wthread-safety -Werror=thread-safety to every clang build, so a violation fails the
# stage's build. Sanitizer options (halt on the first report, suppressions for third-party
# code only) come with the tests from cmake/TensordSanitizers.cmake, so `ctest` in a build
# directory runs them the same way.
#
# On a 2-core machine from a fresh clone the whole run takes about 30 minutes (README.md);
# `tests/run_all.sh build` alone, the quick check, about 9.
#
# A failing stage does not stop the later ones (they are independent builds), so one run
# shows every failure; the script exits non-zero if any stage failed. Only a failure of
# `deps` stops it at once.
#
# Usage: tests/run_all.sh [stage...]   (default: deps build asan tsan fuzz, in that order)
# Environment: JOBS (parallel build and test jobs; default: the number of CPUs),
#              TENSORD_FUZZ_SECONDS (seconds per fuzzer; default 30),
#              CI (true: a backend left out for want of its headers fails the configure
#              step instead of leaving its tests out; .ci/run sets it).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${JOBS:-$(nproc)}"
fuzz_seconds="${TENSORD_FUZZ_SECONDS:-30}"
stages=("$@")
if [ ${#stages[@]} -eq 0 ]; then
  stages=(deps build asan tsan fuzz)
fi

banner() {
  echo
  echo "================================================================================"
  echo "== $*"
  echo "================================================================================"
}

duration() {
  printf '%dm%02ds' $(($1 / 60)) $(($1 % 60))
}

# The default build's flags: line tables only (-g1, not -g), a third less compile time, and
# backtraces and sanitizer-free crash reports still name file and line; a developer
# debugging with locals configures their own tree.
default_build_flags=(
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
)

# configure_and_build DIR [cmake args...]
configure_and_build() {
  local dir="$1"
  shift
  cmake -S . -B "$dir" -G Ninja "$@"
  cmake --build "$dir" -j "$jobs"
}

# Runs in a subshell with errexit, so the first failing command ends the stage.
stage_commands() {
  case "$1" in
    deps)
      ./deploy/install-deps.sh
      ;;
    build)
      configure_and_build build "${default_build_flags[@]}"
      ctest --test-dir build --output-on-failure -j "$jobs"
      ;;
    asan)
      cmake -S . -B build-asan -G Ninja -DTENSORD_SANITIZER=address
      cmake --build build-asan -j "$jobs" --target tensord_tests
      ctest --test-dir build-asan --output-on-failure -j "$jobs"
      ;;
    tsan)
      # clang: its ignorelist keeps gRPC's inline header code uninstrumented (see
      # cmake/TensordSanitizers.cmake), and its thread-safety analysis checks the lock
      # annotations (an error fails the build; see the top-level CMakeLists.txt).
      CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DTENSORD_SANITIZER=thread
      cmake --build build-tsan -j "$jobs" --target tensord_tests
      ctest --test-dir build-tsan --output-on-failure -j "$jobs"
      ;;
    fuzz)
      # The fuzzers need clang (libFuzzer); only they and what they link are built.
      CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DTENSORD_BUILD_FUZZERS=ON \
        -DTENSORD_FUZZ_SECONDS="$fuzz_seconds"
      cmake --build build-fuzz -j "$jobs" --target tensord_fuzzers
      ctest --test-dir build-fuzz --output-on-failure -j "$jobs" -L fuzz
      ;;
    deploy)
      # The same build/ as the build stage (the units run its `cmake --install`); run.sh
      # builds only what an install holds.
      cmake -S . -B build -G Ninja "${default_build_flags[@]}"
      tests/deploy/live/run.sh
      ;;
    *)
      echo "run_all.sh: unknown stage '$1' (deps, build, asan, tsan, fuzz, deploy)" >&2
      return 2
      ;;
  esac
}

started=$(date +%s)
summary=()
failed=0
for stage in "${stages[@]}"; do
  stage_start=$(date +%s)
  banner "stage ${stage}: start ($(date '+%H:%M:%S'), ${jobs} jobs)"
  # Not `( ... ) || rc=$?`: errexit is ignored inside anything on the left of `||`.
  set +e
  (
    set -e
    stage_commands "$stage"
  )
  rc=$?
  set -e
  seconds=$(($(date +%s) - stage_start))
  if [ "$rc" -eq 0 ]; then
    result="passed"
  else
    result="FAILED (exit ${rc})"
    failed=1
  fi
  summary+=("$(printf '%-6s %-18s %s' "$stage" "$result" "$(duration "$seconds")")")
  banner "stage ${stage}: ${result} in $(duration "$seconds")"
  if [ "$rc" -ne 0 ] && [ "$stage" = deps ]; then
    break
  fi
done

total=$(($(date +%s) - started))
if [ "$failed" -eq 0 ]; then
  banner "all stages passed in $(duration "$total")"
else
  banner "some stages FAILED; total $(duration "$total")"
fi
printf '   %s\n' "${summary[@]}"
exit "$failed"
