// The memory kinds tensord knows (memory_kind.h), registered in one table.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/memory/memory_kind.h"

namespace tensord::common {

// Every kind, host first.
std::span<const MemoryKind> MemoryKinds();
// The kind of a DLPack / wire device type; nullptr for one tensord does not know.
const MemoryKind* FindMemoryKind(int32_t device_type);
// The kind users name with `prefix` ("cpu", "cuda", "xpu"); nullptr for none.
const MemoryKind* FindMemoryKindByPrefix(std::string_view prefix);
// How a user names a device of this process: "cpu", "cuda:1", "cuda_host", "xpu:0";
// "device<type>:<id>" for a type tensord does not know.
std::string DeviceName(int32_t device_type, int32_t device_id);
// The wire name of a device type without its prefix: "CPU", "CUDA_HOST", "ONEAPI".
std::string WireTypeName(tensord::v1::DeviceType type);
// The known kinds' wire names, for an error that lists them: "CPU, CUDA, CUDA_HOST or ONEAPI".
std::string KnownDeviceTypeNames();

}  // namespace tensord::common
