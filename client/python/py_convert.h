// Conversions between tensord's C++ values and plain Python data: dtype names ('float32'),
// numpy array-interface type strings, and dicts for TensorInfo, TensorStat, BrokerStatus and
// WatchEvent. Call with the GIL held.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <pybind11/pybind11.h>

#include "tensord/client.h"

namespace tensord::python {

// 'float32', 'bool', 'bfloat16', ...; nullopt for a dtype tensord does not name.
std::optional<std::string> DtypeName(DLDataType dtype);
// The inverse; throws InvalidArgument (as a StatusError) naming the dtype.
DLDataType DtypeFromName(std::string_view name);
// numpy's array-interface typestr ('<f4', '|b1'); nullopt when numpy has no such type
// (bfloat16).
std::optional<std::string> NumpyTypestr(DLDataType dtype);
size_t ItemSize(DLDataType dtype);

pybind11::dict InfoToDict(const TensorInfo& info);
pybind11::dict StatToDict(const TensorStat& stat);
// "session_usage" only with `sessions`, "queues" only with `queues` (the status was asked for them).
pybind11::dict StatusToDict(const BrokerStatus& status, bool sessions, bool queues = false);
pybind11::dict EventToDict(const WatchEvent& event);

// The memory kinds (tensord::MemoryKinds()) for the package's device names and stream rules:
//   _memory_kinds()            [{'device_type', 'name', 'device_prefix', 'numbered',
//                                'host_readable', 'own_memory'}, ...], host first
//   _device_name(type, id)     'cpu', 'cuda:1', 'cuda_host', 'xpu:0'
//   _parse_device_name(text)   (device_type, device_id); ValueError naming the forms it takes
void BindMemoryKinds(pybind11::module_& m);

}  // namespace tensord::python
