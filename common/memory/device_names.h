// How devices are named across processes and in what users see. An ordinal is a
// per-process accident (CUDA_VISIBLE_DEVICES differs between processes); a GPU's UUID is
// not, so the broker keys quotas and status by it.
//  - host memory: "host"
//  - a GPU: "<backend>:<uuid>", the UUID in the form nvidia-smi prints for CUDA
//    ("cuda:GPU-3f1c2a9e-...") and as plain 8-4-4-4-12 hex for others.
#pragma once

#include <string>
#include <string_view>

#include "tensord/v1/tensor.pb.h"

namespace tensord::common {

// The kind's name (memory_kinds.h): "host", "cuda", "level_zero" (or "device type N" for
// one tensord does not know).
std::string BackendNameOf(tensord::v1::DeviceType type);
// 16 raw bytes as "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", after the kind's uuid_prefix
// ("GPU-" for CUDA); anything but 16 bytes as plain hex.
std::string FormatDeviceUuid(tensord::v1::DeviceType type, std::string_view uuid);
// The key quotas and status use: "host" (a kind with one device), or
// "<backend>:<formatted uuid>" (by ordinal,
// "<backend>:<index>", only when a device has no UUID).
std::string DeviceKey(const tensord::v1::Device& device);

}  // namespace tensord::common
