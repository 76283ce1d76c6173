#include "py_convert.h"

#include <pybind11/stl.h>

#include "py_errors.h"

namespace tensord::python {
namespace {

namespace py = pybind11;

struct DtypeEntry {
  DLDataType dtype;
  const char* name;
  const char* typestr;  // null: numpy has no such type
};

constexpr DtypeEntry kDtypes[] = {
    {dtypes::kBool, "bool", "|b1"},          {dtypes::kInt8, "int8", "|i1"},
    {dtypes::kInt16, "int16", "<i2"},        {dtypes::kInt32, "int32", "<i4"},
    {dtypes::kInt64, "int64", "<i8"},        {dtypes::kUInt8, "uint8", "|u1"},
    {dtypes::kUInt16, "uint16", "<u2"},      {dtypes::kUInt32, "uint32", "<u4"},
    {dtypes::kUInt64, "uint64", "<u8"},      {dtypes::kFloat16, "float16", "<f2"},
    {dtypes::kFloat32, "float32", "<f4"},    {dtypes::kFloat64, "float64", "<f8"},
    {dtypes::kBFloat16, "bfloat16", nullptr}, {dtypes::kComplex64, "complex64", "<c8"},
    {dtypes::kComplex128, "complex128", "<c16"},
};

const DtypeEntry* Find(DLDataType dtype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.dtype.code == dtype.code && e.dtype.bits == dtype.bits &&
        e.dtype.lanes == dtype.lanes) {
      return &e;
    }
  }
  return nullptr;
}

const char* StateName(TensorState state) {
  switch (state) {
    case TensorState::kCreating: return "creating";
    case TensorState::kSealed: return "sealed";
    case TensorState::kRetired: return "retired";
  }
  return "unknown";
}

std::string DtypeString(DLDataType dtype) {
  if (auto name = DtypeName(dtype)) return *name;
  return "dtype(code=" + std::to_string(dtype.code) + ",bits=" + std::to_string(dtype.bits) +
         ",lanes=" + std::to_string(dtype.lanes) + ")";
}

}  // namespace

std::optional<std::string> DtypeName(DLDataType dtype) {
  const DtypeEntry* e = Find(dtype);
  if (e == nullptr) return std::nullopt;
  return std::string(e->name);
}

DLDataType DtypeFromName(std::string_view name) {
  for (const DtypeEntry& e : kDtypes) {
    if (name == e.name) return e.dtype;
  }
  throw StatusError(Status(StatusCode::kInvalidArgument,
                           "unknown dtype '" + std::string(name) + "'"));
}

std::optional<std::string> NumpyTypestr(DLDataType dtype) {
  const DtypeEntry* e = Find(dtype);
  if (e == nullptr || e->typestr == nullptr) return std::nullopt;
  return std::string(e->typestr);
}

size_t ItemSize(DLDataType dtype) { return (size_t{dtype.bits} * dtype.lanes + 7) / 8; }

py::dict InfoToDict(const TensorInfo& info) {
  py::dict d;
  d["tensor_id"] = info.tensor_id;
  d["name"] = info.name.empty() ? py::object(py::none()) : py::object(py::str(info.name));
  d["generation"] = info.generation;
  d["dtype"] = DtypeString(info.dtype);
  d["shape"] = py::tuple(py::cast(info.shape));
  d["strides"] = py::tuple(py::cast(info.strides));
  d["byte_offset"] = info.byte_offset;
  d["device"] = py::make_tuple(info.device.device_type, info.device.device_id);
  d["state"] = StateName(info.state);
  d["tags"] = py::cast(info.tags);
  d["created"] = static_cast<double>(info.created_unix_ms) / 1000.0;
  d["lease_count"] = info.lease_count;
  d["nbytes"] = info.nbytes;
  d["buffer_id"] = info.buffer_id;
  d["buffer_size"] = info.buffer_size;
  d["buffer_offset"] = info.buffer_offset;
  d["arena"] = info.arena;
  return d;
}

py::dict StatToDict(const TensorStat& stat) {
  py::dict d = InfoToDict(stat.info);
  py::list holders;
  for (const LeaseHolder& h : stat.holders) {
    py::dict hd;
    hd["session_id"] = h.session_id;
    hd["pid"] = h.pid;
    hd["uid"] = h.uid;
    hd["gid"] = h.gid;
    hd["leases"] = h.leases;
    hd["producer"] = h.producer;
    holders.append(hd);
  }
  d["holders"] = holders;
  return d;
}

py::dict StatusToDict(const BrokerStatus& s) {
  py::dict d;
  d["version"] = s.version;
  d["pid"] = s.pid;
  d["uid"] = s.uid;
  d["uptime"] = static_cast<double>(s.uptime_ms) / 1000.0;
  d["host_bytes_in_use"] = s.host_bytes_in_use;
  d["host_bytes_limit"] = s.host_bytes_limit;
  d["tensors"] = s.tensors;
  d["named_tensors"] = s.named_tensors;
  d["buffers"] = s.buffers;
  d["leases"] = s.leases;
  d["sessions"] = s.sessions;
  d["socket"] = s.socket;
  d["releases_not_found"] = s.releases_not_found;
  return d;
}

py::dict EventToDict(const WatchEvent& event) {
  py::dict d;
  switch (event.kind) {
    case WatchEvent::Kind::kBound: d["kind"] = "bound"; break;
    case WatchEvent::Kind::kUnbound: d["kind"] = "unbound"; break;
    case WatchEvent::Kind::kReset: d["kind"] = "reset"; break;
  }
  d["name"] = event.name;
  d["generation"] = event.generation;
  d["tensor"] = event.tensor ? py::object(InfoToDict(*event.tensor)) : py::object(py::none());
  return d;
}

}  // namespace tensord::python
