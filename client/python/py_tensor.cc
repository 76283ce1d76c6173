#include "py_tensor.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "py_convert.h"
#include "py_dlpack.h"
#include "py_errors.h"
#include "py_gil.h"

namespace tensord::python {

namespace py = pybind11;

std::shared_ptr<TensorRef> PyTensor::Ref() const {
  if (!ref_) throw py::value_error("tensor " + Describe() + " was released");
  return ref_;
}

std::string PyTensor::Describe() const {
  return info_.name.empty() ? "#" + std::to_string(info_.tensor_id) : "'" + info_.name + "'";
}

py::tuple PyTensor::Device() const {
  return py::make_tuple(info_.device.device_type, info_.device.device_id);
}

py::object PyTensor::DLPack(py::object stream, py::object max_version, py::object dl_device,
                            py::object copy) const {
  if (!copy.is_none() && copy.cast<bool>()) {
    throw py::buffer_error("tensord exports zero-copy views only (copy=True refused); "
                           "copy the result instead");
  }
  if (!dl_device.is_none()) {
    auto wanted = dl_device.cast<std::pair<int32_t, int32_t>>();
    if (wanted.first != info_.device.device_type || wanted.second != info_.device.device_id) {
      throw py::buffer_error("tensor " + Describe() + " lives on device (" +
                             std::to_string(info_.device.device_type) + ", " +
                             std::to_string(info_.device.device_id) + "); cannot export to (" +
                             std::to_string(wanted.first) + ", " +
                             std::to_string(wanted.second) + ") without a copy");
    }
  }
  bool versioned = false;
  if (!max_version.is_none()) {
    auto version = max_version.cast<std::pair<uint32_t, uint32_t>>();
    versioned = version.first >= kDLPackMajorVersion;
  }
  std::shared_ptr<TensorRef> ref = Ref();
  // DLPack's stream protocol: the consumer's stream waits for the producer's writes, as the
  // memory kind's stream rule says (MemoryKindInfo::StreamRule); -1 asks for no ordering.
  const MemoryKindInfo* kind = FindMemoryKind(info_.device.device_type);
  const auto rule = kind != nullptr ? kind->streams : MemoryKindInfo::StreamRule::kNone;
  if (rule != MemoryKindInfo::StreamRule::kNone) {
    const bool cuda = rule == MemoryKindInfo::StreamRule::kCuda;
    // None: CUDA's legacy default stream; a kind without a default stream waits on the host (0).
    const int64_t none = cuda ? static_cast<int64_t>(kLegacyDefaultStream) : 0;
    const int64_t wanted = stream.is_none() ? none : stream.cast<int64_t>();
    if (wanted == 0 && cuda) {
      throw py::value_error("__dlpack__: stream 0 is ambiguous for CUDA (the DLPack protocol disallows it); "
                            "pass 1 for the legacy default stream or the stream's handle");
    }
    if (wanted != -1) {
      ThrowIfError(WithoutGil([&] { return ref->UseOnStream(static_cast<uintptr_t>(wanted)); }));
    }
  }
  if (versioned) {
    DLManagedTensorVersioned* view = ref->ToDLPackVersioned();
    if (readonly_) view->flags |= kDLFlagBitMaskReadOnly;
    return MakeVersionedCapsule(view);
  }
  if (readonly_) {
    throw py::buffer_error("tensor " + Describe() + " is a read-only mapping, which a legacy "
                           "DLPack capsule cannot signal; pass max_version=(1, 0), use "
                           ".numpy() or .torch(), or get it without " +
                           (pinned() ? "pinned=True" : "readonly=True"));
  }
  return MakeLegacyCapsule(ref->ToDLPack());
}

// TensorFlow's test: every dimension longer than 1 has the stride of a row-major layout
// (dimensions of length 1 may have any stride); an empty tensor is compact.
bool CompactRowMajor(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  if (strides.empty()) return true;
  if (strides.size() != shape.size()) return false;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return true;  // no element to misplace
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

py::object PyTensor::ToStreamlessCapsule() const {
  if (readonly_) {
    throw py::buffer_error("tensor " + Describe() + " is a read-only mapping, which an unversioned DLPack "
                           "capsule cannot signal: get it without " +
                           std::string(pinned() ? "pinned=True" : "readonly=True") + " to hand it to to_dlpack()");
  }
  if (!CompactRowMajor(info_.shape, info_.strides)) {
    throw py::buffer_error("tensor " + Describe() + " is not compact row-major, which consumers of a streamless "
                           "capsule (TensorFlow) refuse: put() a compact copy");
  }
  std::shared_ptr<TensorRef> ref = Ref();
  ThrowIfError(WithoutGil([&] { return ref->WaitReadyOnHost(); }));
  DLManagedTensor* view = ref->ToDLPack();
  // Our views already fold byte_offset into the pointer; keep it so for consumers that refuse
  // any other value.
  view->dl_tensor.data = static_cast<char*>(view->dl_tensor.data) + view->dl_tensor.byte_offset;
  view->dl_tensor.byte_offset = 0;
  return MakeLegacyCapsule(view);
}

void PyTensor::UseOnStream(uintptr_t stream) const {
  std::shared_ptr<TensorRef> ref = Ref();
  ThrowIfError(WithoutGil([&] { return ref->UseOnStream(stream); }));
}

py::object PyTensor::LegacyCapsuleAs(const std::string& as_dtype) const {
  DLDataType dtype = DtypeFromName(as_dtype);
  if (ItemSize(dtype) != ItemSize(info_.dtype)) {
    throw py::type_error("cannot view " + DtypeName(info_.dtype).value_or("?") + " as " +
                         as_dtype + ": different item size");
  }
  DLManagedTensor* view = Ref()->ToDLPack();
  view->dl_tensor.dtype = dtype;
  // A pinned view is host memory, which torch 1.13 refuses under kDLCUDAHost ("Unsupported
  // device_type: 3"): it gets the CPU tensor it is.
  if (pinned()) view->dl_tensor.device = DLDevice{kDLCPU, 0};
  return MakeLegacyCapsule(view);
}

py::object PyTensor::NumpyArray() const { return MakeNumpyArray(Ref()->ToDLPack(), readonly_); }

py::tuple PyTensor::HandOver(std::optional<double> ttl_seconds) const {
  std::shared_ptr<TensorRef> ref = Ref();
  std::shared_ptr<Client> client = client_.lock();
  if (!client) {
    throw py::value_error("tensor " + Describe() + " cannot be handed over: the client that holds it is closed");
  }
  std::chrono::milliseconds ttl{0};
  if (ttl_seconds) {
    if (!(*ttl_seconds > 0) || *ttl_seconds > 3600) {
      throw py::value_error("hand-over ttl: give seconds in (0, 3600], or None for the broker's 60 s");
    }
    ttl = std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(*ttl_seconds * 1000)));
  }
  HandOverToken token = Unwrap(WithoutGil([&] { return client->HandOver(*ref, ttl); }));
  return py::make_tuple(token.token, client->socket_path());
}

uintptr_t PyTensor::DataPtr() const { return reinterpret_cast<uintptr_t>(Ref()->data()); }

void BindTensor(py::module_& m) {
  py::class_<PyTensor>(m, "Tensor", "A tensor held through tensord (see tensord.Tensor).")
      .def("__dlpack__", &PyTensor::DLPack, py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none(),
           "The DLPack protocol: a capsule over this tensor's memory, no copy. max_version (1, 0) or "
           "more gives a versioned capsule (flagged read-only for a read-only view); a GPU tensor "
           "orders `stream` on the producer's writes. copy=True and a dl_device elsewhere raise "
           "BufferError.")
      .def("__dlpack_device__", &PyTensor::Device, "(device_type, device_id), as DLPack numbers them.")
      .def("use_on_stream", &PyTensor::UseOnStream, py::arg("stream"),
           "GPU tensors: makes `stream` (an int handle, e.g. torch's stream.cuda_stream) wait for the "
           "producer's writes, and holds the lease's release until the work queued there is done. "
           "__dlpack__(stream=...) does this for the stream it is given. Nothing for host tensors.")
      .def("to_dlpack", &PyTensor::ToStreamlessCapsule,
           "An unversioned DLPack capsule for a consumer that takes one with no stream, such as "
           "tf.experimental.dlpack.from_dlpack: a GPU tensor's producer writes are waited for on the host "
           "first (stream-aware consumers should use __dlpack__(stream=...), which never blocks the host); "
           "strides are compact row-major and byte_offset is 0. BufferError for a read-only view or strides "
           "that are not compact.")
      .def("_legacy_capsule_as", &PyTensor::LegacyCapsuleAs, py::arg("dtype"))
      .def("_numpy", &PyTensor::NumpyArray)
      .def("_hand_over", &PyTensor::HandOver, py::arg("ttl") = py::none())
      .def_property_readonly("_data_ptr", &PyTensor::DataPtr)
      .def("release", &PyTensor::Release,
           "Drops this handle's own reference now; views made from it keep theirs.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyTensor& t, py::args) { t.Release(); })
      .def_property_readonly("shape",
                             [](const PyTensor& t) { return py::tuple(py::cast(t.info().shape)); },
                             "The shape, a tuple of ints.")
      .def_property_readonly("strides",
                             [](const PyTensor& t) { return py::tuple(py::cast(t.info().strides)); },
                             "The strides in elements (not bytes), a tuple of ints.")
      .def_property_readonly("dtype",
                             [](const PyTensor& t) { return DtypeName(t.info().dtype); })
      .def_property_readonly("name",
                             [](const PyTensor& t) -> std::optional<std::string> {
                               if (t.info().name.empty()) return std::nullopt;
                               return t.info().name;
                             },
                             "The name it was bound to when this handle got it; None for an unnamed "
                             "or unpublished tensor.")
      .def_property_readonly("tensor_id", [](const PyTensor& t) { return t.info().tensor_id; },
                             "The broker's id of the tensor (get(tensor_id) acquires it).")
      .def_property_readonly("generation", [](const PyTensor& t) { return t.info().generation; },
                             "The generation it was published at (0 before its publish).")
      .def_property_readonly("nbytes", [](const PyTensor& t) { return t.info().nbytes; },
                             "The bytes of its elements.")
      .def_property_readonly("device", &PyTensor::Device)
      .def_property_readonly("readonly", &PyTensor::readonly,
                             "True for a read-only view (get(readonly=True), pinned views).")
      .def_property_readonly("pinned", &PyTensor::pinned,
                             "True for a pinned view of host memory (get/take with pinned=True).")
      .def_property_readonly("writable", &PyTensor::producer,
                             "True for a tensor from empty(): fill it, then publish it.")
      .def_property_readonly("released", &PyTensor::released,
                             "True once release() dropped this handle's reference.")
      .def_property_readonly("info", [](const PyTensor& t) { return InfoToDict(t.info()); },
                             "The tensor's description as a dict (as stat() gives it, without holders).")
      .def("__repr__", [](const PyTensor& t) {
        std::string repr = "<tensord.Tensor " + t.Describe() + " " +
                           DtypeName(t.info().dtype).value_or("?") + "[";
        for (size_t i = 0; i < t.info().shape.size(); ++i) {
          if (i > 0) repr += ", ";
          repr += std::to_string(t.info().shape[i]);
        }
        repr += t.released() ? "] released>" : "]>";
        return repr;
      });
}

}  // namespace tensord::python
