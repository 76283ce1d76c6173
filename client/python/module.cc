// tensord._tensord: the C++ half of `import tensord` (the Python package re-exports it with a
// cleaner API). This file is the module's table; each class lives with its binding:
//   _Client, _Watcher  py_client.h    Tensor     py_tensor.h
//   _Source            py_source.h    _ArrayView the owner of a .numpy() array's memory (py_dlpack.h)
// Errors: tensord.Error subclasses (py_errors.h); BufferError for DLPack requests that cannot
// be honoured; ValueError for a released tensor or a closed client. Calls that block release
// the GIL (py_gil.h).
//
// This module is a plain user of the public C++ API: it includes nothing but <tensord/...>
// and pybind11, and links only the shared client library (never tensord_common /
// tensord_proto: a second copy of the generated protobuf code in one process aborts at
// startup). So it also builds against an installed libtensord alone (tests/gpu/).
#include <Python.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "py_client.h"
#include "py_convert.h"
#include "py_dlpack.h"
#include "py_errors.h"
#include "py_gil.h"
#include "py_source.h"
#include "py_tensor.h"
#include "tensord/client.h"

PYBIND11_MODULE(_tensord, m) {
  using namespace tensord;          // NOLINT: the binding table reads better unqualified
  using namespace tensord::python;  // NOLINT
  namespace py = pybind11;
  m.doc() = "C++ half of the tensord package; use `import tensord`.";
#ifdef NDEBUG
  // Debian's abseil checks every Mutex acquisition (gRPC's included) for lock-order
  // cycles, a debugging aid that costs a global lock per acquisition on the hot path.
  // The interpreter is ours to configure; a C++ application decides this for itself.
  DisableLockOrderChecks();
#endif
  InitGilRelease();
  RegisterErrors(m);
  m.attr("DLPACK_VERSION") = py::make_tuple(kDLPackMajorVersion, kDLPackMinorVersion);
  m.def("default_socket_path", &DefaultClientSocketPath,
        "The socket a client uses when connect() is given none.");
  m.def("_consume_on_native_thread_for_test", &ConsumeOnNativeThreadForTest, py::arg("capsule"));
  m.def("_compact_row_major", &CompactRowMajor, py::arg("shape"), py::arg("strides"));
  BindMemoryKinds(m);

  // In this order: a class's signatures name the classes bound before it.
  py::class_<ArrayView>(m, "_ArrayView");
  BindSource(m);
  BindTensor(m);
  BindWatcher(m);
  BindClient(m);
}
