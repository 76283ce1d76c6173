#include "server/memory/memory_quota.h"

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/human_bytes.h"

namespace tensord::server {

void MemoryQuota::SetLimit(std::string_view key, uint64_t bytes, std::string_view flag) {
  auto it = devices_.find(key);
  if (it == devices_.end()) it = devices_.emplace(std::string(key), Device{}).first;
  it->second.limit = bytes;
  it->second.flag = std::string(flag);
}

absl::Status MemoryQuota::Reserve(std::string_view key, uint64_t bytes, std::string_view what) {
  auto it = devices_.find(key);
  if (it == devices_.end()) {
    if (bytes == 0) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(std::string(what), " needs ", common::ExactAndHumanBytes(bytes),
                                                     " of memory on ", std::string(key),
                                                     ": tensord has no memory quota for that device"));
  }
  Device& device = it->second;
  if (bytes > device.limit || device.in_use > device.limit - bytes) {
    // Host memory keeps the words it always had; other devices are named by their key.
    std::string memory = key == kHost ? "host memory" : absl::StrCat("memory on ", std::string(key));
    return absl::ResourceExhaustedError(absl::StrCat(
        std::string(what), " needs ", common::ExactAndHumanBytes(bytes), " of ", memory, ": ",
        common::ExactAndHumanBytes(device.in_use), " are in use of the limit of ",
        common::ExactAndHumanBytes(device.limit), " (", device.flag, ")"));
  }
  device.in_use += bytes;
  return absl::OkStatus();
}

void MemoryQuota::Release(std::string_view key, uint64_t bytes) {
  auto it = devices_.find(key);
  TENSORD_CHECK(it != devices_.end() && it->second.in_use >= bytes);
  it->second.in_use -= bytes;
}

uint64_t MemoryQuota::InUse(std::string_view key) const {
  auto it = devices_.find(key);
  return it == devices_.end() ? 0 : it->second.in_use;
}

uint64_t MemoryQuota::Limit(std::string_view key) const {
  auto it = devices_.find(key);
  return it == devices_.end() ? 0 : it->second.limit;
}

}  // namespace tensord::server
