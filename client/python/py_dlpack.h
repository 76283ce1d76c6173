// DLPack views as Python objects: capsules for `__dlpack__` and the array-interface holder
// behind `Tensor.numpy()`.
//
// Ownership: each function takes one DLPack view (one reference on the lease) and hands it
// to a Python object. A capsule owns its view until a consumer renames it ("used_dltensor"
// / "used_dltensor_versioned") and takes it over; the capsule's destructor calls the
// deleter only for an unconsumed view. An ArrayView owns its view until it is destroyed.
// tensord's deleters never block, never take the GIL and never touch Python objects, so a
// consumer may call them from any thread, also during interpreter shutdown.
#pragma once

#include <pybind11/pybind11.h>

#include "tensord/dlpack.h"

namespace tensord::python {

inline constexpr const char* kLegacyCapsuleName = "dltensor";
inline constexpr const char* kVersionedCapsuleName = "dltensor_versioned";
inline constexpr const char* kUsedLegacyCapsuleName = "used_dltensor";
inline constexpr const char* kUsedVersionedCapsuleName = "used_dltensor_versioned";

pybind11::object MakeLegacyCapsule(DLManagedTensor* view);
pybind11::object MakeVersionedCapsule(DLManagedTensorVersioned* view);

// The owner of a numpy array's memory: numpy keeps this object as the array's base, so the
// lease lives exactly as long as the array and its views.
class ArrayView {
 public:
  explicit ArrayView(DLManagedTensor* view) : view_(view) {}
  ~ArrayView();
  ArrayView(const ArrayView&) = delete;
  ArrayView& operator=(const ArrayView&) = delete;

 private:
  DLManagedTensor* view_;
};

// A numpy array over `view`'s memory (no copy), its base an ArrayView that owns the view;
// non-writeable when `readonly`. Built with numpy's C API (through pybind11) rather than
// the array interface: no dict to build and parse per array. TypeError when numpy has no
// such dtype (bfloat16); the view is released then.
pybind11::object MakeNumpyArray(DLManagedTensor* view, bool readonly);

// Test hook: consumes the capsule like a native consumer would (renames it) and calls the
// view's deleter on a new native thread that has no Python thread state, with the GIL
// released, then joins it.
void ConsumeOnNativeThreadForTest(pybind11::object capsule);

}  // namespace tensord::python
