#include "py_dlpack.h"

#include <Python.h>
#include <pybind11/numpy.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "py_convert.h"
#include "py_gil.h"

namespace tensord::python {
namespace {

namespace py = pybind11;

// Runs when the capsule object dies, with the GIL held, maybe with an exception set (so it
// is saved around the calls) and maybe during interpreter shutdown.
void LegacyCapsuleDestructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kLegacyCapsuleName)) return;  // consumed
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* view = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kLegacyCapsuleName));
  if (view != nullptr && view->deleter != nullptr) view->deleter(view);
  PyErr_Restore(type, value, traceback);
}

void VersionedCapsuleDestructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kVersionedCapsuleName)) return;  // consumed
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* view = static_cast<DLManagedTensorVersioned*>(
      PyCapsule_GetPointer(capsule, kVersionedCapsuleName));
  if (view != nullptr && view->deleter != nullptr) view->deleter(view);
  PyErr_Restore(type, value, traceback);
}

}  // namespace

py::object MakeLegacyCapsule(DLManagedTensor* view) {
  PyObject* capsule = PyCapsule_New(view, kLegacyCapsuleName, &LegacyCapsuleDestructor);
  if (capsule == nullptr) {
    view->deleter(view);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

py::object MakeVersionedCapsule(DLManagedTensorVersioned* view) {
  PyObject* capsule = PyCapsule_New(view, kVersionedCapsuleName, &VersionedCapsuleDestructor);
  if (capsule == nullptr) {
    view->deleter(view);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

ArrayView::~ArrayView() {
  if (view_ != nullptr && view_->deleter != nullptr) view_->deleter(view_);
}

py::object MakeNumpyArray(DLManagedTensor* view, bool readonly) {
  // Owned from here on: an early throw releases the view with the holder.
  py::object base = py::cast(std::make_unique<ArrayView>(view));
  const DLTensor& t = view->dl_tensor;
  std::optional<std::string> typestr = NumpyTypestr(t.dtype);
  if (!typestr) {
    std::string name = DtypeName(t.dtype).value_or("this dtype");
    throw py::type_error("numpy has no " + name + " dtype; use .torch() for " + name +
                         " tensors");
  }
  const auto item = static_cast<py::ssize_t>(ItemSize(t.dtype));
  std::vector<py::ssize_t> shape(t.shape, t.shape + t.ndim);
  std::vector<py::ssize_t> strides(static_cast<size_t>(t.ndim));
  for (int i = 0; i < t.ndim; ++i) strides[static_cast<size_t>(i)] = t.strides[i] * item;
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  py::array array(py::dtype(*typestr), std::move(shape), std::move(strides), data, base);
  if (readonly) array.attr("setflags")(py::arg("write") = false);
  return array;
}

void ConsumeOnNativeThreadForTest(py::object capsule) {
  PyObject* c = capsule.ptr();
  if (PyCapsule_IsValid(c, kLegacyCapsuleName)) {
    auto* view = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, kLegacyCapsuleName));
    if (PyCapsule_SetName(c, kUsedLegacyCapsuleName) != 0) throw py::error_already_set();
    WithoutGil([view] { std::thread([view] { view->deleter(view); }).join(); });
  } else if (PyCapsule_IsValid(c, kVersionedCapsuleName)) {
    auto* view = static_cast<DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(c, kVersionedCapsuleName));
    if (PyCapsule_SetName(c, kUsedVersionedCapsuleName) != 0) throw py::error_already_set();
    WithoutGil([view] { std::thread([view] { view->deleter(view); }).join(); });
  } else {
    throw py::value_error("not an unconsumed DLPack capsule");
  }
}

}  // namespace tensord::python
