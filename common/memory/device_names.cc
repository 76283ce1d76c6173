#include "common/memory/device_names.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tensord::common {

std::string BackendNameOf(tensord::v1::DeviceType type) {
  switch (type) {
    case tensord::v1::DEVICE_TYPE_CPU: return "host";
    case tensord::v1::DEVICE_TYPE_CUDA: return "cuda";
    case tensord::v1::DEVICE_TYPE_CUDA_HOST: return "cuda_host";
    case tensord::v1::DEVICE_TYPE_ONEAPI: return "level_zero";
    default: return absl::StrCat("device type ", static_cast<int>(type));
  }
}

std::string FormatDeviceUuid(tensord::v1::DeviceType type, std::string_view uuid) {
  const std::string hex = absl::BytesToHexString(AbslView(uuid));
  if (uuid.size() != 16) return hex;
  std::string out = absl::StrCat(hex.substr(0, 8), "-", hex.substr(8, 4), "-", hex.substr(12, 4), "-",
                                 hex.substr(16, 4), "-", hex.substr(20));
  return type == tensord::v1::DEVICE_TYPE_CUDA ? "GPU-" + out : out;
}

std::string DeviceKey(const tensord::v1::Device& device) {
  if (device.type() == tensord::v1::DEVICE_TYPE_CPU) return "host";
  if (device.uuid().empty()) return absl::StrCat(BackendNameOf(device.type()), ":", device.index());
  return absl::StrCat(BackendNameOf(device.type()), ":", FormatDeviceUuid(device.type(), device.uuid()));
}

}  // namespace tensord::common
