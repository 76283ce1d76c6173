#include "common/memory/memory_kinds.h"

#include "absl/strings/str_cat.h"
#include "common/memory/cuda/cuda_kind.h"
#include "common/memory/host/host_kind.h"
#include "common/memory/level_zero/ze_kind.h"
#include "common/status.h"

namespace tensord::common {
namespace {

// The registration: one line per kind, host first.
constexpr MemoryKind kKinds[] = {
    kHostKind,
    kCudaKind,
    kCudaHostKind,
    kLevelZeroKind,
};

}  // namespace

std::span<const MemoryKind> MemoryKinds() { return kKinds; }

const MemoryKind* FindMemoryKind(int32_t device_type) {
  for (const MemoryKind& kind : kKinds) {
    if (kind.type == device_type) return &kind;
  }
  return nullptr;
}

const MemoryKind* FindMemoryKindByPrefix(std::string_view prefix) {
  for (const MemoryKind& kind : kKinds) {
    if (kind.device_prefix == prefix) return &kind;
  }
  return nullptr;
}

std::string DeviceName(int32_t device_type, int32_t device_id) {
  const MemoryKind* kind = FindMemoryKind(device_type);
  if (kind == nullptr) return absl::StrCat("device", device_type, ":", device_id);
  if (!kind->numbered) return std::string(kind->device_prefix);
  return absl::StrCat(AbslView(kind->device_prefix), ":", device_id);
}

std::string WireTypeName(tensord::v1::DeviceType type) {
  std::string name = tensord::v1::DeviceType_Name(type);
  constexpr std::string_view kPrefix = "DEVICE_TYPE_";
  if (name.starts_with(kPrefix)) name.erase(0, kPrefix.size());
  return name.empty() ? absl::StrCat(static_cast<int>(type)) : name;
}

std::string KnownDeviceTypeNames() {
  std::string names;
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    if (i > 0) names += i + 1 == std::size(kKinds) ? " or " : ", ";
    names += WireTypeName(kKinds[i].type);
  }
  return names;
}

}  // namespace tensord::common
