#!/usr/bin/env bash
# Runs tensord's GPU checks on a machine with an NVIDIA GPU, from programs built on Debian 12
# and packed with ../shared/tools/gpu-bundle.sh (docs/gpu-runs/README.md says how). Every
# step writes its raw output under OUT; a failing step is reported and the next one runs.
#
#   tests/gpu/run-on-gpu.sh BUNDLE OUT
#
# BUNDLE holds bin/ (tensord, tensorctl, cuda_gpu_test, tensord_cuda_peer, libtensord.so,
# and tensord_cuda_bench if its figures are wanted) and lib/. PYTHON (default python3) must
# have torch with CUDA, pybind11 and pytest (JAX and CuPy for their tests): the Python
# module is compiled here, with this machine's own compiler (the log says which), for that
# interpreter from client/python against the bundle's libtensord.so and the public headers
# alone (it is a plain user of the public C++ API); nothing of the bundle is put on
# LD_LIBRARY_PATH. Steps, most important first: the C++ GPU tests; the module; the Python
# GPU tests (torch, JAX, CuPy); the CUDA handoff against torch.multiprocessing, its calls
# timed one by one, and its producer held to a window of items in flight; producer and consumer in separate PID and IPC namespaces; the `import
# tensord, torch` crash probe and the conditions it depends on; the device bench; the
# daemon's own GPU memory; the batch pipeline feeding the GPU; the whole
# Python suite on this interpreter and torch. TENSORD_GPU_STEPS="name ..." runs only those.
# Any process that dies of a signal leaves a core (when the kernel lets us set core_pattern),
# and `crash_stacks.log` has cuda-gdb's native stack of each. OUT may hold more files than a
# `device` call brings back: tar it.
set -uo pipefail
[[ $# -eq 2 ]] || { sed -n 2,24p "$0"; exit 2; }
bundle=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
cd "$repo"
# shellcheck source=/dev/null
source "$bundle/env.sh"
failed=()
# TENSORD_GPU_STEPS: the steps to run (names as below, space-separated); default all. The
# module is built whenever a Python step runs.
step() {  # step NAME SECONDS COMMAND...: runs it with a time limit, output to OUT/NAME.log
  local name=$1 limit=$2; shift 2
  if [[ -n ${TENSORD_GPU_STEPS:-} && " $TENSORD_GPU_STEPS python_module " != *" $name "* ]]; then return 0; fi
  echo "== $name" >&2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$out/$name.log" >&2
  ((rc == 0)) || failed+=("$name ($rc)")
  return $rc
}

{ nvidia-smi; ldd --version | head -1; uname -r; nproc
  echo "compiler: $(command -v "${CXX:-g++}") -> $(readlink -f "$(command -v "${CXX:-g++}")")"; "${CXX:-g++}" --version | head -1
  echo "cuda-gdb: $(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  "$py" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda)'
  "$py" -c 'import jax; print("jax", jax.__version__)' 2>&1 | tail -1
  "$py" -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -1
  "$py" -m pip list 2>/dev/null | grep -iE "^(pybind11|numpy|pytest) "
} >"$out/env.txt" 2>&1

# Cores of any process that dies of a signal, for cuda-gdb's native stack (crash_stacks.log).
cores=/tmp/tensord-cores
mkdir -p "$cores"
ulimit -c unlimited
if echo "$cores/core.%e.%p" >/proc/sys/kernel/core_pattern 2>>"$out/env.txt"; then
  echo "core_pattern: $(cat /proc/sys/kernel/core_pattern)" >>"$out/env.txt"
else
  echo "core_pattern: not settable ($(cat /proc/sys/kernel/core_pattern)); no cores" >>"$out/env.txt"
fi

# A program linked with -ltensord against bin/ (test_readme.py's C++ snippet) loads the
# library by its soname, which the bundle keeps in lib/.
[[ -e $bundle/bin/libtensord.so.0 ]] || ln -sf libtensord.so "$bundle/bin/libtensord.so.0"  # bin/ copy: its RUNPATH finds lib/

# The C++ tests name the daemon and the peer by the build-tree paths they were compiled with:
# links to the bundle's there (a real build tree, as on the machine that built the bundle, is
# left alone).
for f in $(strings "$bundle/bin/cuda_gpu_test" | grep -E '^/.*/build/(server/tensord|tests/integration/tensord_cuda_peer)$' | sort -u); do
  mkdir -p "$(dirname "$f")"
  [[ -e $f && ! -L $f ]] || ln -sf "$bundle/bin/${f##*/}" "$f"
done
step cuda_gpu_test 150 "$bundle/bin/cuda_gpu_test"

# The Python package for this interpreter, in a build-tree layout (python/tensord,
# server/tensord) that the tests and benchmarks take. Built with -g and the debug info split
# off (_tensord.debug, kept in OUT to resolve a stack offline): the module that runs has
# the code a build without -g has.
tree=/tmp/tensord-gpu-tree
build_module() {
  rm -rf "$tree" && mkdir -p "$tree/python/tensord" "$tree/server" "$tree/client/cli" "$tree/obj" || return 1
  ln -sf "$bundle/bin/tensord" "$tree/server/tensord"
  ln -sf "$bundle/bin/tensorctl" "$tree/client/cli/tensorctl"  # the tests find it beside $TENSORD_BIN
  cp client/python/tensord/*.py client/python/tensord/*.pyi client/python/tensord/py.typed "$tree/python/tensord/"
  # _version.py as CMake writes it, from the one project version in CMakeLists.txt.
  local version
  version=$(sed -n 's/^project(tensord VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt) && [[ -n $version ]] || return 1
  sed "s/@PROJECT_VERSION@/$version/" client/python/tensord/_version.py.in >"$tree/python/tensord/_version.py"
  local ext includes
  ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') || return 1
  # pybind11's headers from its Python package, else from the compiler's default paths.
  includes=$("$py" -c '
import sysconfig
try:
    import pybind11
    print("-I" + pybind11.get_include(), end=" ")
except ImportError:
    pass
print("-I" + sysconfig.get_paths()["include"])') || return 1
  echo "compiler: $(readlink -f "$(command -v "${CXX:-g++}")"): $("${CXX:-g++}" --version | head -1)"
  echo "includes: $includes"
  local pids=() f
  for f in client/python/*.cc; do
    # PYBIND11_COMPILER_TYPE: the module's own pybind11 internals, as client/python/CMakeLists.txt says.
    # shellcheck disable=SC2086
    ${CXX:-g++} -std=c++20 -O2 -g -DNDEBUG -DPYBIND11_COMPILER_TYPE='"_tensord"' -fPIC -fvisibility=hidden \
      $includes -Iabi/include -Iclient/include \
      -c "$f" -o "$tree/obj/$(basename "$f" .cc).o" & pids+=($!)
  done
  for f in "${pids[@]}"; do wait "$f" || return 1; done
  local module=$tree/python/tensord/_tensord$ext
  ${CXX:-g++} -shared -o "$module" "$tree"/obj/*.o -L"$bundle/bin" -l:libtensord.so \
    -Wl,-rpath,"$bundle/bin:$bundle/lib" || return 1
  objcopy --only-keep-debug "$module" "$out/_tensord.debug" && strip --strip-debug "$module" || return 1
  PYTHONPATH=$tree/python "$py" -c 'import tensord; print("built", tensord.__file__)'
}
if step python_module 180 bash -c "$(declare -f build_module); bundle=$bundle tree=$tree py=$py out=$out build_module"; then
  # PYTHONFAULTHANDLER: a Python process that crashes prints where, in the step's log.
  export PYTHONPATH=$tree/python TENSORD_BIN=$tree/server/tensord PYTHONDONTWRITEBYTECODE=1 PYTHONFAULTHANDLER=1
  step python_cuda_gpu 240 "$py" -m pytest -v -rs -s -p no:cacheprovider tests/python/cuda_gpu

  sock_dir=$(mktemp -d)
  tensord --socket "$sock_dir/t.sock" --log-level warn >"$out/handoff_daemon.log" 2>&1 &
  daemon=$!
  sleep 1
  step cuda_handoff 240 "$py" tests/bench/cuda_handoff.py --socket "$sock_dir/t.sock"
  step cuda_call_times 120 "$py" tests/bench/cuda_call_times.py --socket "$sock_dir/t.sock"
  step cuda_handoff_window 240 "$py" tests/bench/cuda_handoff_window.py --socket "$sock_dir/t.sock"
  if [[ -x $bundle/bin/tensord_cuda_bench ]]; then
    step cuda_bench 60 "$bundle/bin/tensord_cuda_bench" --socket "$sock_dir/t.sock"
  fi
  # Producer and consumer each in PID and IPC namespaces of their own (as in two containers
  # that share neither), the daemon in the machine's: device memory crosses as a VMM fd on
  # the socket. nofence: the producer synchronizes and publishes with stream=-1 (decides the
  # step); ordered: with a ready event, which an H200 would not open across PID namespaces
  # (reported only).
  step namespaces 120 bash tests/gpu/namespaces.sh "$py" "$sock_dir/t.sock"
  kill "$daemon"; wait "$daemon"

  # `import tensord, torch` has died with SIGSEGV on this image before (docs/gpu-runs): ten
  # times here, then the README snippets as test_readme.py runs them; any core is read below.
  # The package's __init__ is bypassed by raw_first (the extension loaded as tensord/__init__
  # would, with nothing before it), and LD_DEBUG=bindings says which object each of torch's
  # std::call_once symbols binds to in each order.
  crash_probe() {
    local i module
    module=$(ls "$tree"/python/tensord/_tensord*.so)
    for i in 1 2 3 4 5 6 7 8 9 10; do
      "$py" -c 'import tensord, torch; print("imported", torch.__version__)'; echo "import tensord, torch: exit $?"
    done
    local raw_first="import importlib.machinery as m, importlib.util as u
l = m.ExtensionFileLoader('tensord._tensord', '$module'); s = u.spec_from_loader('tensord._tensord', l)
l.exec_module(u.module_from_spec(s)); import torch; print('imported')"
    for i in 1 2 3; do "$py" -c "$raw_first"; echo "the extension alone, then torch: exit $?"; done
    local order
    for order in raw_first torch_first package_first; do
      case $order in
        raw_first) code=$raw_first ;;
        torch_first) code="import torch, tensord" ;;
        package_first) code="import tensord, torch" ;;
      esac
      rm -f /tmp/lddebug.*
      LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/lddebug "$py" -c "$code" >/dev/null 2>&1; echo "== $order (LD_DEBUG=bindings): exit $?"
      cat /tmp/lddebug.* | grep -E "\`(__once_proxy|_ZSt11__once_call|_ZSt15__once_callable)'" | grep -E "libtorch_python|libc10.so|libtorch_cpu" | sed 's/^ *[0-9]*: *//' | sort | uniq -c | head -20
      echo "-- objects defining __once_proxy that anything bound to:"
      cat /tmp/lddebug.* | grep -E "\`__once_proxy'" | sed -n 's/.* to \([^ ]*\) .*/\1/p' | sort | uniq -c
    done
    "$py" -m pytest -q -rs -p no:cacheprovider tests/python/test_readme.py -k snippet
  }
  TENSORD_LIB_DIR=$bundle/bin TENSORD_CXX=${CXX:-g++} step crash_probe 200 bash -c "$(declare -f crash_probe); py=$py tree=$tree crash_probe"

  # What the crash depends on: the package with and without its libstdc++ load, and the
  # runtime or every library of the bundle preloaded (their TLS static). Reports only.
  step import_variants 400 bash tests/gpu/import_variants.sh "$py" "$tree" "$bundle"

  step daemon_gpu_memory 60 "$py" tests/gpu/daemon_gpu_memory.py "$bundle/bin/tensord"

  step batch_pipeline_gpu 300 "$py" tests/bench/batch_pipeline.py --build-dir "$tree" --device cuda:0 \
    --workers 4 --repeat 2 --json-out "$out/batch_pipeline_gpu.json"

  TENSORD_LIB_DIR=$bundle/bin TENSORD_CXX=${CXX:-g++} step python_suite 200 "$py" -m pytest -q -rs -p no:cacheprovider \
    --ignore=tests/python/cuda_fake --ignore=tests/python/level_zero_fake --ignore=tests/python/cuda_gpu tests/python
fi

# The native stack of every core left behind, with our module's offsets resolvable offline
# (addr2line -e _tensord.debug; libtensord.so's against the unstripped build it was bundled from).
gdb=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
{
  shopt -s nullglob
  found=0
  for core in "$cores"/core.*; do
    found=1
    name=${core##*/core.}
    name=${name%.*}  # core_pattern's %e: the program's name
    exe=$("$py" -c 'import sys; print(sys.executable)')
    [[ -x $bundle/bin/$name ]] && exe=$bundle/bin/$name
    echo "=== $core ($exe)"
    if [[ -n $gdb ]]; then
      timeout 120 "$gdb" -batch -ex "info sharedlibrary" -ex "thread apply all bt 40" "$exe" "$core" 2>&1 | tail -400
    else
      echo "no cuda-gdb here"
    fi
  done
  ((found)) || echo "no cores: no process died of a signal (core_pattern: $(cat /proc/sys/kernel/core_pattern))"
} >"$out/crash_stacks.log" 2>&1

if ((${#failed[@]})); then
  echo "failed: ${failed[*]}" | tee "$out/summary.txt"
  exit 1
fi
echo "every step passed" | tee "$out/summary.txt"
