#!/usr/bin/env bash
# Runs tensord's GPU checks on a machine with an NVIDIA GPU, from programs built on Debian 12
# and packed with ../shared/tools/gpu-bundle.sh (docs/gpu-runs/README.md says how). Every
# step writes its raw output under OUT; a failing step is reported and the next one runs.
#
#   tests/gpu/run-on-gpu.sh BUNDLE OUT
#
# BUNDLE holds bin/ (tensord, tensorctl, cuda_gpu_test, tensord_cuda_peer, libtensord.so,
# and tensord_cuda_bench if its figures are wanted) and lib/. PYTHON (default python3) must
# have torch with CUDA, pybind11 and pytest: the Python module is compiled here for it from
# client/python against the bundle's libtensord.so and the public headers alone (it is a
# plain user of the public C++ API). Steps: the C++ GPU tests; the module; the Python GPU
# tests; the daemon's own GPU memory; the CUDA handoff against torch.multiprocessing and the
# device bench; the batch pipeline feeding the GPU; the whole Python suite on this
# interpreter and torch.
set -uo pipefail
[[ $# -eq 2 ]] || { sed -n 2,15p "$0"; exit 2; }
bundle=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
cd "$repo"
# shellcheck source=/dev/null
source "$bundle/env.sh"
failed=()
step() {  # step NAME SECONDS COMMAND...: runs it with a time limit, output to OUT/NAME.log
  local name=$1 limit=$2; shift 2
  echo "== $name" >&2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$out/$name.log" >&2
  ((rc == 0)) || failed+=("$name ($rc)")
  return $rc
}

{ nvidia-smi; ldd --version | head -1; uname -r; nproc
  "$py" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >"$out/env.txt" 2>&1

# The C++ tests name the daemon and the peer by their build-tree paths.
mkdir -p "$repo/build/server" "$repo/build/tests/integration"
ln -sf "$bundle/bin/tensord" "$repo/build/server/tensord"
ln -sf "$bundle/bin/tensord_cuda_peer" "$repo/build/tests/integration/tensord_cuda_peer"
step cuda_gpu_test 240 "$bundle/bin/cuda_gpu_test"

# The Python package for this interpreter, in a build-tree layout (python/tensord,
# server/tensord) that the tests and benchmarks take.
tree=/tmp/tensord-gpu-tree
build_module() {
  rm -rf "$tree" && mkdir -p "$tree/python/tensord" "$tree/server" "$tree/client/cli" "$tree/obj" || return 1
  ln -sf "$bundle/bin/tensord" "$tree/server/tensord"
  ln -sf "$bundle/bin/tensorctl" "$tree/client/cli/tensorctl"  # the tests find it beside $TENSORD_BIN
  cp client/python/tensord/*.py "$tree/python/tensord/"
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
  local pids=() f
  for f in client/python/*.cc; do
    # PYBIND11_COMPILER_TYPE: the module's own pybind11 internals, as client/python/CMakeLists.txt says.
    # shellcheck disable=SC2086
    ${CXX:-g++} -std=c++20 -O2 -DNDEBUG -DPYBIND11_COMPILER_TYPE='"_tensord"' -fPIC -fvisibility=hidden \
      $includes -Iabi/include -Iclient/include \
      -c "$f" -o "$tree/obj/$(basename "$f" .cc).o" & pids+=($!)
  done
  for f in "${pids[@]}"; do wait "$f" || return 1; done
  ${CXX:-g++} -shared -o "$tree/python/tensord/_tensord$ext" "$tree"/obj/*.o -L"$bundle/bin" -l:libtensord.so \
    -Wl,-rpath,"$bundle/bin:$bundle/lib" || return 1
  PYTHONPATH=$tree/python "$py" -c 'import tensord; print("built", tensord.__file__)'
}
if step python_module 240 bash -c "$(declare -f build_module); bundle=$bundle tree=$tree py=$py build_module"; then
  # PYTHONFAULTHANDLER: a Python process that crashes prints where, in the step's log.
  export PYTHONPATH=$tree/python TENSORD_BIN=$tree/server/tensord PYTHONDONTWRITEBYTECODE=1 PYTHONFAULTHANDLER=1
  step python_cuda_gpu 240 "$py" -m pytest -v -rs -p no:cacheprovider tests/python/cuda_gpu

  # What the daemon itself costs on the GPU: its processes in nvidia-smi before any device
  # tensor, with one, and after it is gone.
  step daemon_gpu_memory 120 "$py" - "$bundle/bin/tensord" <<'EOF'
import atexit, os, subprocess, sys, tempfile, time
import tensord
d = tempfile.mkdtemp()
sock = os.path.join(d, "t.sock")
daemon = subprocess.Popen([sys.argv[1], "--socket", sock, "--log-level", "info"])
atexit.register(lambda: daemon.poll() is None and daemon.kill())  # also when a step below fails
def apps(when):
    q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
                       capture_output=True, text=True).stdout
    print(f"-- {when} (daemon pid {daemon.pid})\n{q}", flush=True)
for _ in range(200):
    if os.path.exists(sock + ".fd"):
        break
    time.sleep(0.05)
time.sleep(0.5)
c = tensord.connect(sock)
apps("daemon started, no device tensor")
t = c.empty((256 << 20,), "float32", device="cuda:0")  # 1 GiB
c.publish(t, "m/one")
t.release()
apps("one 1 GiB device tensor published (this client holds a mapping of it)")
print([b for b in c.status()["backends"] if b["name"] == "cuda"])
c.delete("m/one")
c.flush()
time.sleep(0.5)
apps("deleted")
c.close()
daemon.terminate()
daemon.wait()
EOF

  sock_dir=$(mktemp -d)
  tensord --socket "$sock_dir/t.sock" --log-level warn >"$out/handoff_daemon.log" 2>&1 &
  daemon=$!
  sleep 1
  step cuda_handoff 240 "$py" tests/bench/cuda_handoff.py --socket "$sock_dir/t.sock" --count 200 --mib 64
  if [[ -x $bundle/bin/tensord_cuda_bench ]]; then
    step cuda_bench 240 "$bundle/bin/tensord_cuda_bench" --socket "$sock_dir/t.sock"
  fi
  kill "$daemon"; wait "$daemon"

  step batch_pipeline_gpu 300 "$py" tests/bench/batch_pipeline.py --build-dir "$tree" --device cuda:0 \
    --workers 4 --repeat 2 --json-out "$out/batch_pipeline_gpu.json"
  TENSORD_LIB_DIR=$bundle/bin TENSORD_CXX=${CXX:-g++} step python_suite 240 "$py" -m pytest -q -rs -p no:cacheprovider \
    --ignore=tests/python/cuda_fake --ignore=tests/python/level_zero_fake --ignore=tests/python/cuda_gpu tests/python
fi

if ((${#failed[@]})); then
  echo "failed: ${failed[*]}" | tee "$out/summary.txt"
  exit 1
fi
echo "every step passed" | tee "$out/summary.txt"
