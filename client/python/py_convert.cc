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
  std::string valid;
  for (const DtypeEntry& e : kDtypes) valid += std::string(valid.empty() ? "" : ", ") + e.name;
  throw StatusError(Status(StatusCode::kInvalidArgument,
                           "unknown dtype '" + std::string(name) + "': give one of " + valid));
}

std::optional<std::string> NumpyTypestr(DLDataType dtype) {
  const DtypeEntry* e = Find(dtype);
  if (e == nullptr || e->typestr == nullptr) return std::nullopt;
  return std::string(e->typestr);
}

size_t ItemSize(DLDataType dtype) { return (size_t{dtype.bits} * dtype.lanes + 7) / 8; }

namespace {

// The keys of a description dict, made and interned once: a put_many or a listing builds
// thousands of these dicts, and making 17 key strings for each cost more than the values.
// Never freed (a dict may outlive the module during interpreter shutdown).
struct InfoKeys {
  PyObject* tensor_id = Intern("tensor_id");
  PyObject* name = Intern("name");
  PyObject* generation = Intern("generation");
  PyObject* dtype = Intern("dtype");
  PyObject* shape = Intern("shape");
  PyObject* strides = Intern("strides");
  PyObject* byte_offset = Intern("byte_offset");
  PyObject* device = Intern("device");
  PyObject* state = Intern("state");
  PyObject* tags = Intern("tags");
  PyObject* created = Intern("created");
  PyObject* lease_count = Intern("lease_count");
  PyObject* nbytes = Intern("nbytes");
  PyObject* buffer_id = Intern("buffer_id");
  PyObject* buffer_size = Intern("buffer_size");
  PyObject* buffer_offset = Intern("buffer_offset");
  PyObject* arena = Intern("arena");
  PyObject* recyclable = Intern("recyclable");

  static PyObject* Intern(const char* key) {
    PyObject* s = PyUnicode_InternFromString(key);
    if (s == nullptr) throw py::error_already_set();
    return s;
  }
};

const InfoKeys& Keys() {
  static const InfoKeys* keys = new InfoKeys();  // first use holds the GIL
  return *keys;
}

void Set(const py::dict& d, PyObject* key, const py::handle& value) {
  if (PyDict_SetItem(d.ptr(), key, value.ptr()) != 0) throw py::error_already_set();
}

}  // namespace

py::dict InfoToDict(const TensorInfo& info) {
  const InfoKeys& k = Keys();
  py::dict d;
  Set(d, k.tensor_id, py::int_(info.tensor_id));
  Set(d, k.name, info.name.empty() ? py::object(py::none()) : py::object(py::str(info.name)));
  Set(d, k.generation, py::int_(info.generation));
  Set(d, k.dtype, py::str(DtypeString(info.dtype)));
  Set(d, k.shape, py::tuple(py::cast(info.shape)));
  Set(d, k.strides, py::tuple(py::cast(info.strides)));
  Set(d, k.byte_offset, py::int_(info.byte_offset));
  Set(d, k.device, py::make_tuple(info.device.device_type, info.device.device_id));
  Set(d, k.state, py::str(StateName(info.state)));
  Set(d, k.tags, py::cast(info.tags));
  Set(d, k.created, py::float_(static_cast<double>(info.created_unix_ms) / 1000.0));
  Set(d, k.lease_count, py::int_(info.lease_count));
  Set(d, k.nbytes, py::int_(info.nbytes));
  Set(d, k.buffer_id, py::int_(info.buffer_id));
  Set(d, k.buffer_size, py::int_(info.buffer_size));
  Set(d, k.buffer_offset, py::int_(info.buffer_offset));
  Set(d, k.arena, py::bool_(info.arena));
  Set(d, k.recyclable, py::bool_(info.recyclable));
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

py::dict StatusToDict(const BrokerStatus& s, bool sessions, bool queues) {
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
  d["host_bytes_pooled"] = s.host_bytes_pooled;
  d["pooled_buffers"] = s.pooled_buffers;
  d["hand_overs_pending"] = s.hand_overs_pending;
  d["leases_reclaimed"] = s.leases_reclaimed;
  py::list pins;
  for (const HandOverPins& p : s.hand_over_pins) {
    py::dict e;
    e["uid"] = p.uid;
    e["hand_overs"] = p.hand_overs;
    e["host_bytes"] = p.host_bytes;
    e["device_bytes"] = p.device_bytes;
    pins.append(e);
  }
  d["hand_over_pins"] = pins;
  if (s.cluster) {
    const ClusterStatus& c = *s.cluster;
    py::dict e;
    e["node"] = c.node;
    e["listen"] = c.listen;
    e["namespaces"] = c.namespaces;
    e["etcd_endpoint"] = c.etcd_endpoint;
    e["joined"] = c.joined;
    e["names_recorded"] = c.names_recorded;
    e["replicas"] = c.replicas;
    e["pulls"] = c.pulls;
    e["bytes_pulled"] = c.bytes_pulled;
    e["pulls_failed"] = c.pulls_failed;
    e["reads_open"] = c.reads_open;
    e["reads_served"] = c.reads_served;
    e["bytes_served"] = c.bytes_served;
    e["device_copies"] = c.device_copies;
    d["cluster"] = e;
  }
  if (queues) {
    py::list queue_list;
    for (const QueueStatus& q : s.queues) {
      py::dict e;
      e["prefix"] = q.prefix;
      e["depth"] = q.depth;
      e["slots_held"] = q.slots_held;
      e["published"] = q.published;
      e["producers_waiting"] = q.producers_waiting;
      e["takers_waiting"] = q.takers_waiting;
      queue_list.append(e);
    }
    d["queues"] = queue_list;
  }
  if (sessions) {
    py::list list;
    for (const SessionUsage& u : s.session_usage) {
      py::dict e;
      e["id"] = u.id;
      e["pid"] = u.pid;
      e["uid"] = u.uid;
      e["gid"] = u.gid;
      e["client_name"] = u.client_name;
      e["opened"] = static_cast<double>(u.opened_unix_ms) / 1000.0;  // Unix time in seconds
      e["leases"] = u.leases;
      e["bytes_leased"] = u.bytes_leased;
      e["tensors_produced"] = u.tensors_produced;
      e["bytes_produced"] = u.bytes_produced;
      e["leases_granted"] = u.leases_granted;
      e["publishes"] = u.publishes;
      e["waiting"] = u.waiting;
      list.append(e);
    }
    d["session_usage"] = list;
  }
  py::list backends;
  for (const BackendInfo& backend : s.backends) {
    py::dict b;
    b["name"] = backend.name;
    b["built"] = backend.built;
    b["available"] = backend.built && backend.unavailable_reason.empty();
    b["unavailable_reason"] = backend.unavailable_reason;
    py::list devices;
    for (const DeviceUsage& usage : backend.devices) {
      py::dict u;
      u["device_type"] = static_cast<int>(usage.device.device_type);
      u["device_id"] = usage.device.device_id;
      u["uuid"] = usage.uuid;
      u["key"] = usage.key;
      u["name"] = usage.name;
      u["total_bytes"] = usage.total_bytes;
      u["bytes_in_use"] = usage.bytes_in_use;
      u["bytes_limit"] = usage.bytes_limit;
      u["bytes_pooled"] = usage.bytes_pooled;
      devices.append(u);
    }
    b["devices"] = devices;
    backends.append(b);
  }
  d["backends"] = backends;
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

void BindMemoryKinds(py::module_& m) {
  m.def("_memory_kinds", [] {
    py::list kinds;
    for (const MemoryKindInfo& kind : MemoryKinds()) {
      py::dict d;
      d["device_type"] = kind.device_type;
      d["name"] = std::string(kind.name);
      d["device_prefix"] = std::string(kind.device_prefix);
      d["numbered"] = kind.numbered;
      d["host_readable"] = kind.host_readable;
      d["own_memory"] = kind.own_memory;
      kinds.append(std::move(d));
    }
    return kinds;
  });
  m.def(
      "_device_name",
      [](int32_t type, int32_t id) { return DeviceName(DLDevice{static_cast<DLDeviceType>(type), id}); },
      py::arg("device_type"), py::arg("device_id"));
  m.def(
      "_parse_device_name",
      [](const std::string& text) {
        Result<DLDevice> device = ParseDeviceName(text);
        if (!device.ok()) throw py::value_error(device.status().message() + ", or a (device_type, device_id) tuple");
        return py::make_tuple(static_cast<int32_t>(device->device_type), device->device_id);
      },
      py::arg("text"));
}

}  // namespace tensord::python
