#include "py_source.h"

#include <cstring>
#include <limits>
#include <string>

#include <pybind11/stl.h>

#include "py_convert.h"
#include "py_dlpack.h"
#include "py_errors.h"
#include "tensord/client.h"

namespace tensord::python {
namespace {

namespace py = pybind11;

[[noreturn]] void Refuse(const std::string& what) { throw py::type_error(what); }

// Memory the host reads, or device memory put copies on a stream of the caller's: a kind
// whose streams follow CUDA's rule (put's `stream` is a CUDA stream number).
void CheckReadableDevice(const DLDevice& device) {
  const MemoryKindInfo* kind = FindMemoryKind(device.device_type);
  if (kind == nullptr || (!kind->host_readable && kind->streams != MemoryKindInfo::StreamRule::kCuda)) {
    throw StatusError(Status(StatusCode::kInvalidArgument,
                             "put copies host memory and CUDA device memory; the object lives on " +
                                 DeviceName(device) + " (DLPack device type " + std::to_string(device.device_type) +
                                 ")"));
  }
}

// Fills shape/byte strides from a DLTensor (null strides: compact C order).
void Describe(const DLTensor& t, DLDataType* dtype, std::vector<int64_t>* shape,
              std::vector<int64_t>* byte_strides) {
  if (t.dtype.lanes != 1 || !DtypeName(t.dtype)) {
    Refuse("DLPack dtype (code " + std::to_string(t.dtype.code) + ", bits " +
           std::to_string(t.dtype.bits) + ", lanes " + std::to_string(t.dtype.lanes) +
           ") has no tensord equivalent");
  }
  if (t.ndim < 0 || t.ndim > 64) Refuse("DLPack ndim " + std::to_string(t.ndim) + " out of range");
  *dtype = t.dtype;
  const auto item = static_cast<int64_t>(ItemSize(t.dtype));
  shape->assign(t.shape, t.shape + t.ndim);
  byte_strides->resize(t.ndim);
  int64_t compact = item;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] < 0) Refuse("DLPack shape has a negative dimension");
    (*byte_strides)[i] = t.strides != nullptr ? t.strides[i] * item : compact;
    compact *= t.shape[i];
  }
}

// struct-module format of the buffer protocol -> dtype.
DLDataType DtypeFromFormat(std::string format, size_t itemsize) {
  if (!format.empty() && (format[0] == '>' || format[0] == '!')) {
    if (itemsize > 1) Refuse("big-endian buffer format '" + format + "' is not supported");
    format.erase(0, 1);
  }
  if (!format.empty() && (format[0] == '@' || format[0] == '=' || format[0] == '<')) {
    format.erase(0, 1);
  }
  const auto bits = static_cast<uint8_t>(itemsize * 8);
  if (format == "?") return dtypes::kBool;
  if (format == "e") return dtypes::kFloat16;
  if (format == "f") return dtypes::kFloat32;
  if (format == "d") return dtypes::kFloat64;
  if (format == "Zf") return dtypes::kComplex64;
  if (format == "Zd") return dtypes::kComplex128;
  if (format == "c") return dtypes::kUInt8;
  if (format.size() == 1 && std::strchr("bhilq", format[0]) != nullptr && itemsize <= 8) {
    return DLDataType{kDLInt, bits, 1};
  }
  if (format.size() == 1 && std::strchr("BHILQ", format[0]) != nullptr && itemsize <= 8) {
    return DLDataType{kDLUInt, bits, 1};
  }
  Refuse("buffer format '" + format + "' has no tensord dtype");
}

// numpy array-interface typestr ('<f4', '|b1') -> dtype.
DLDataType DtypeFromTypestr(const std::string& typestr) {
  if (typestr.size() < 3) Refuse("bad __array_interface__ typestr '" + typestr + "'");
  const char order = typestr[0];
  const char kind = typestr[1];
  const int bytes = std::atoi(typestr.c_str() + 2);
  if (order == '>' && bytes > 1) Refuse("big-endian typestr '" + typestr + "' is not supported");
  const auto bits = static_cast<uint8_t>(bytes * 8);
  DLDataType dtype{};
  switch (kind) {
    case 'b': dtype = DLDataType{kDLBool, bits, 1}; break;
    case 'i': dtype = DLDataType{kDLInt, bits, 1}; break;
    case 'u': dtype = DLDataType{kDLUInt, bits, 1}; break;
    case 'f': dtype = DLDataType{kDLFloat, bits, 1}; break;
    case 'c': dtype = DLDataType{kDLComplex, bits, 1}; break;
    default: Refuse("typestr '" + typestr + "' has no tensord dtype");
  }
  if (bytes <= 0 || bytes > 16 || !DtypeName(dtype)) {
    Refuse("typestr '" + typestr + "' has no tensord dtype");
  }
  return dtype;
}

// Copies the block at `src` (dims from `dim` on) to `dst`; returns the end of what it wrote.
char* CopyDims(char* dst, const char* src, const int64_t* shape, const int64_t* strides,
               size_t ndim, size_t dim, size_t item) {
  if (dim == ndim) {
    std::memcpy(dst, src, item);
    return dst + item;
  }
  if (dim + 1 == ndim) {
    if (strides[dim] == static_cast<int64_t>(item)) {
      const size_t n = static_cast<size_t>(shape[dim]) * item;
      std::memcpy(dst, src, n);
      return dst + n;
    }
    for (int64_t i = 0; i < shape[dim]; ++i) {
      std::memcpy(dst, src + i * strides[dim], item);
      dst += item;
    }
    return dst;
  }
  for (int64_t i = 0; i < shape[dim]; ++i) {
    dst = CopyDims(dst, src + i * strides[dim], shape, strides, ndim, dim + 1, item);
  }
  return dst;
}

}  // namespace

std::unique_ptr<Source> Source::FromDLPack(py::object capsule) {
  std::unique_ptr<Source> s(new Source());
  PyObject* c = capsule.ptr();
  if (PyCapsule_IsValid(c, kLegacyCapsuleName)) {
    auto* view = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, kLegacyCapsuleName));
    CheckReadableDevice(view->dl_tensor.device);
    s->device_ = view->dl_tensor.device;
    Describe(view->dl_tensor, &s->dtype_, &s->shape_, &s->byte_strides_);
    // Ours from here on: the capsule's destructor leaves a renamed capsule alone.
    if (PyCapsule_SetName(c, kUsedLegacyCapsuleName) != 0) throw py::error_already_set();
    s->legacy_ = view;
    s->data_ = static_cast<const char*>(view->dl_tensor.data) + view->dl_tensor.byte_offset;
  } else if (PyCapsule_IsValid(c, kVersionedCapsuleName)) {
    auto* view = static_cast<DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(c, kVersionedCapsuleName));
    if (view->version.major != 1) {
      Refuse("DLPack version " + std::to_string(view->version.major) + " is not supported");
    }
    CheckReadableDevice(view->dl_tensor.device);
    s->device_ = view->dl_tensor.device;
    Describe(view->dl_tensor, &s->dtype_, &s->shape_, &s->byte_strides_);
    if (PyCapsule_SetName(c, kUsedVersionedCapsuleName) != 0) throw py::error_already_set();
    s->versioned_ = view;
    s->data_ = static_cast<const char*>(view->dl_tensor.data) + view->dl_tensor.byte_offset;
  } else {
    Refuse("__dlpack__ did not return an unconsumed DLPack capsule");
  }
  return s;
}

std::unique_ptr<Source> Source::FromBuffer(py::object obj) {
  std::unique_ptr<Source> s(new Source());
  auto buffer = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(obj.ptr(), buffer.get(), PyBUF_RECORDS_RO) != 0) {
    throw py::error_already_set();
  }
  s->buffer_ = std::move(buffer);  // released by ~Source from here on
  const Py_buffer& b = *s->buffer_;
  s->dtype_ = DtypeFromFormat(b.format != nullptr ? b.format : "B", b.itemsize);
  if (ItemSize(s->dtype_) != static_cast<size_t>(b.itemsize)) {
    Refuse("buffer item size " + std::to_string(b.itemsize) + " does not match its format");
  }
  s->shape_.assign(b.shape, b.shape + b.ndim);
  if (b.strides != nullptr) {
    s->byte_strides_.assign(b.strides, b.strides + b.ndim);
  } else {
    s->byte_strides_.resize(b.ndim);
    int64_t compact = b.itemsize;
    for (int i = b.ndim - 1; i >= 0; --i) {
      s->byte_strides_[i] = compact;
      compact *= b.shape[i];
    }
  }
  if (b.ndim == 0 && b.shape == nullptr && b.len != b.itemsize) {
    // A plain byte buffer without shape: one dimension of len / itemsize items.
    s->shape_ = {static_cast<int64_t>(b.len / b.itemsize)};
    s->byte_strides_ = {b.itemsize};
  }
  s->data_ = static_cast<const char*>(b.buf);
  return s;
}

std::unique_ptr<Source> Source::FromArrayInterface(py::object obj) {
  std::unique_ptr<Source> s(new Source());
  py::dict ai = obj.attr("__array_interface__");
  if (ai.contains("mask") && !ai["mask"].is_none()) Refuse("masked arrays are not supported");
  if (!ai.contains("data") || !py::isinstance<py::tuple>(ai["data"])) {
    Refuse("__array_interface__ without a (pointer, readonly) data tuple is not supported");
  }
  s->dtype_ = DtypeFromTypestr(ai["typestr"].cast<std::string>());
  const auto item = static_cast<int64_t>(ItemSize(s->dtype_));
  s->shape_ = ai["shape"].cast<std::vector<int64_t>>();
  for (int64_t d : s->shape_) {
    if (d < 0) Refuse("__array_interface__ shape has a negative dimension");
  }
  if (ai.contains("strides") && !ai["strides"].is_none()) {
    s->byte_strides_ = ai["strides"].cast<std::vector<int64_t>>();
    if (s->byte_strides_.size() != s->shape_.size()) Refuse("strides do not match the shape");
  } else {
    s->byte_strides_.resize(s->shape_.size());
    int64_t compact = item;
    for (size_t i = s->shape_.size(); i-- > 0;) {
      s->byte_strides_[i] = compact;
      compact *= s->shape_[i];
    }
  }
  py::tuple data = ai["data"];
  s->data_ = reinterpret_cast<const char*>(data[0].cast<uintptr_t>());
  s->owner_ = std::move(obj);
  return s;
}

Source::~Source() {
  if (legacy_ != nullptr && legacy_->deleter != nullptr) legacy_->deleter(legacy_);
  if (versioned_ != nullptr && versioned_->deleter != nullptr) versioned_->deleter(versioned_);
  if (buffer_) PyBuffer_Release(buffer_.get());
}

uint64_t Source::nbytes() const {
  uint64_t n = ItemSize(dtype_);
  for (int64_t d : shape_) {
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      throw StatusError(Status(StatusCode::kInvalidArgument, "array size overflows"));
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

void Source::OverrideDtype(DLDataType dtype) {
  if (ItemSize(dtype) != ItemSize(dtype_)) throw py::type_error("dtype override changes item size");
  dtype_ = dtype;
}

bool Source::compact() const {
  // Dimensions of size 1 may carry any stride.
  int64_t expected = static_cast<int64_t>(ItemSize(dtype_));
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && byte_strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void Source::CopyTo(void* dst) const {
  const uint64_t n = nbytes();
  if (n == 0) return;
  if (on_device()) {
    // The caller's bug: device memory is not readable from the host.
    throw StatusError(Status(StatusCode::kInternal, "a device source cannot be copied by the host"));
  }
  if (compact()) {
    std::memcpy(dst, data_, n);
    return;
  }
  CopyDims(static_cast<char*>(dst), data_, shape_.data(), byte_strides_.data(), shape_.size(), 0,
           ItemSize(dtype_));
}

void BindSource(py::module_& m) {
  py::class_<Source>(m, "_Source")
      .def_static("from_dlpack", &Source::FromDLPack, py::arg("capsule"))
      .def_static("from_buffer", &Source::FromBuffer, py::arg("obj"))
      .def_static("from_array_interface", &Source::FromArrayInterface, py::arg("obj"))
      .def_property_readonly("dtype", [](const Source& s) { return DtypeName(s.dtype()); })
      .def_property_readonly("shape", [](const Source& s) { return py::tuple(py::cast(s.shape())); })
      .def("override_dtype",
           [](Source& s, const std::string& dtype) { s.OverrideDtype(DtypeFromName(dtype)); });
}

}  // namespace tensord::python
