#!/usr/bin/env bash
# Which loading conditions the `import tensord` / torch crash on the GPU image depends on
# (docs/gpu-runs): the Python suite's first files up to test_batch.py (where the run of
# c3a8394 died in the module's first numpy call) and, the extension
# loaded alone and then torch (twice), under four conditions:
#   shipped        the package as built (its __init__ loads libstdc++ RTLD_GLOBAL first)
#   no_preload     the same package without that load
#   ld_preload_cxx LD_PRELOAD=libstdc++.so.6: the C++ runtime loaded at start-up, its TLS static
#   ld_preload_all LD_PRELOAD=the bundle's libtensord.so: it and every library it needs
#                  (gRPC, abseil, protobuf...) loaded at start-up, their TLS static
# Reports only: the caller decides nothing from its exit status.
#
#   tests/gpu/import_variants.sh PYTHON TREE BUNDLE
set -u
py=$1 tree=$2 bundle=$3
module=$(ls "$tree"/python/tensord/_tensord*.so)
cxx=$("$py" -c 'import ctypes.util, sys; print(ctypes.util.find_library("stdc++") or "libstdc++.so.6")')
plain=$tree-no-preload
rm -rf "$plain" && cp -a "$tree" "$plain"
sed -i 's/^_cxx_runtime_in_global_scope()$/pass  # import_variants.sh: left out/' "$plain/python/tensord/__init__.py"
grep -n "import_variants.sh: left out" "$plain/python/tensord/__init__.py" || echo "no_preload: the call was not found in __init__.py"
files="tests/python/test_aio.py tests/python/test_api.py tests/python/test_batch.py"
raw="import importlib.machinery as m, importlib.util as u
l = m.ExtensionFileLoader('tensord._tensord', '$module'); s = u.spec_from_loader('tensord._tensord', l)
l.exec_module(u.module_from_spec(s)); import torch; print('imported')"
for variant in shipped no_preload ld_preload_cxx ld_preload_all; do
  path=$tree/python preload=
  case $variant in
    no_preload) path=$plain/python ;;
    ld_preload_cxx) preload=$cxx ;;
    ld_preload_all) preload=$bundle/bin/libtensord.so ;;
  esac
  echo "=== $variant (PYTHONPATH=$path LD_PRELOAD=${preload:-})"
  PYTHONPATH=$path LD_PRELOAD=$preload timeout 120 "$py" -m pytest -q -p no:cacheprovider $files 2>&1 | tail -4
  echo "--- $variant: pytest exit ${PIPESTATUS[0]}"
  for i in 1 2; do
    LD_PRELOAD=$preload timeout 60 "$py" -c "$raw" >/dev/null 2>&1
    echo "--- $variant: the extension alone, then torch: exit $?"
  done
done
