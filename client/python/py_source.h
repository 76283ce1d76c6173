// Source: memory that `client.put` copies into the broker, described once whatever it came
// from: a DLPack capsule (legacy or versioned), the buffer protocol, or numpy's array
// interface. Any strides (negative and overlapping ones too) are allowed; CopyTo writes a
// compact C-order copy.
//
// A Source owns what keeps its memory valid (the consumed DLPack view, the Py_buffer, or the
// exporting object) and frees it when destroyed, which needs the GIL. CopyTo does not touch
// Python and may run with the GIL released while the Source stays alive.
// Refusals: TypeError for a format or dtype tensord cannot represent, InvalidArgument for
// memory that is not on the host.
#pragma once

#include <Python.h>

#include <cstdint>
#include <memory>
#include <vector>

#include <pybind11/pybind11.h>

#include "tensord/client.h"
#include "tensord/dlpack.h"

namespace tensord::python {

class Source {
 public:
  static std::unique_ptr<Source> FromDLPack(pybind11::object capsule);
  static std::unique_ptr<Source> FromBuffer(pybind11::object obj);
  static std::unique_ptr<Source> FromArrayInterface(pybind11::object obj);
  ~Source();
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  DLDataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& byte_strides() const { return byte_strides_; }
  uint64_t nbytes() const;

  // Reinterprets the elements as `dtype` of the same size (a torch bool tensor arrives as
  // uint8 because torch will not export bool over DLPack).
  void OverrideDtype(DLDataType dtype);

  // Where the memory is: memory the host reads (cpu, cuda_host), or a CUDA device, whose
  // bytes only a device copy reads (on_device()).
  DLDevice device() const { return device_; }
  bool on_device() const {
    const MemoryKindInfo* kind = FindMemoryKind(device_.device_type);
    return kind != nullptr && !kind->host_readable;
  }
  const void* data() const { return data_; }
  // Compact C order: the bytes are one block of nbytes() at data().
  bool compact() const;

  // Writes nbytes() bytes in C order to `dst`. Host memory only.
  void CopyTo(void* dst) const;

 private:
  Source() = default;

  const char* data_ = nullptr;  // element 0
  DLDevice device_{kDLCPU, 0};
  DLDataType dtype_{};
  std::vector<int64_t> shape_;
  std::vector<int64_t> byte_strides_;

  // What keeps data_ valid; exactly one is set.
  DLManagedTensor* legacy_ = nullptr;
  DLManagedTensorVersioned* versioned_ = nullptr;
  std::unique_ptr<Py_buffer> buffer_;
  pybind11::object owner_;
};

// Adds the class `_Source` to `m`.
void BindSource(pybind11::module_& m);

}  // namespace tensord::python
