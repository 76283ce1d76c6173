#include "common/memory/device_names.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/memory/memory_kinds.h"
#include "common/status.h"

namespace tensord::common {

std::string BackendNameOf(tensord::v1::DeviceType type) {
  const MemoryKind* kind = FindMemoryKind(type);
  return kind != nullptr ? std::string(kind->name) : absl::StrCat("device type ", static_cast<int>(type));
}

std::string FormatDeviceUuid(tensord::v1::DeviceType type, std::string_view uuid) {
  const std::string hex = absl::BytesToHexString(AbslView(uuid));
  if (uuid.size() != 16) return hex;
  std::string out = absl::StrCat(hex.substr(0, 8), "-", hex.substr(8, 4), "-", hex.substr(12, 4), "-",
                                 hex.substr(16, 4), "-", hex.substr(20));
  const MemoryKind* kind = FindMemoryKind(type);
  return kind != nullptr ? absl::StrCat(AbslView(kind->uuid_prefix), out) : out;
}

std::string DeviceKey(const tensord::v1::Device& device) {
  const MemoryKind* kind = FindMemoryKind(device.type());
  if (kind != nullptr && !kind->numbered) return std::string(kind->name);
  if (device.uuid().empty()) return absl::StrCat(BackendNameOf(device.type()), ":", device.index());
  return absl::StrCat(BackendNameOf(device.type()), ":", FormatDeviceUuid(device.type(), device.uuid()));
}

}  // namespace tensord::common
