// The Python client classes (tensord._tensord):
//   _Client  one tensord::Client; every call releases the GIL while it talks to the broker;
//            waits run as bounded broker waits with signal checks between them, so Ctrl-C
//            interrupts them and the total deadline holds. Any number of threads may share it.
//   _Watcher a stream of binding changes (_Client.watch).
// Errors: tensord.Error subclasses (py_errors.h); ValueError for a closed client or a
// publish of a tensor that empty() did not make.
#pragma once

#include <pybind11/pybind11.h>

namespace tensord::python {

// Adds the class `_Watcher` to `m`.
void BindWatcher(pybind11::module_& m);

// Adds the class `_Client` to `m`; Tensor, _Watcher and _Source come first (BindTensor,
// BindWatcher, BindSource), so that its signatures name them.
void BindClient(pybind11::module_& m);

}  // namespace tensord::python
