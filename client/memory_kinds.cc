// The public view of the memory kinds (tensord/client.h): common/memory/memory_kinds.h's
// table, in the public API's types, so tensorctl and the Python module name devices and
// apply stream rules from the one description each kind gives of itself.
#include <charconv>
#include <string>
#include <vector>

#include "common/memory/memory_kinds.h"
#include "tensord/client.h"

namespace tensord {
namespace {

MemoryKindInfo::StreamRule PublicRule(common::StreamRule rule) {
  switch (rule) {
    case common::StreamRule::kNone: return MemoryKindInfo::StreamRule::kNone;
    case common::StreamRule::kCuda: return MemoryKindInfo::StreamRule::kCuda;
    case common::StreamRule::kHostWait: return MemoryKindInfo::StreamRule::kHostWait;
  }
  return MemoryKindInfo::StreamRule::kNone;
}

const std::vector<MemoryKindInfo>& Kinds() {
  static const std::vector<MemoryKindInfo>* const kinds = [] {
    auto* out = new std::vector<MemoryKindInfo>();
    for (const common::MemoryKind& kind : common::MemoryKinds()) {
      out->push_back(MemoryKindInfo{static_cast<int32_t>(kind.type), kind.name, kind.device_prefix, kind.numbered,
                                    kind.host_readable, kind.own_memory, PublicRule(kind.streams)});
    }
    return out;
  }();
  return *kinds;
}

// "'cpu', 'cuda', 'cuda:N', 'xpu', 'xpu:N'": what ParseDeviceName takes.
std::string DeviceForms() {
  std::string forms;
  for (const MemoryKindInfo& kind : Kinds()) {
    if (!kind.own_memory) continue;
    if (!forms.empty()) forms += ", ";
    forms.append("'").append(kind.device_prefix).append("'");
    if (kind.numbered) forms.append(", '").append(kind.device_prefix).append(":N'");
  }
  return forms;
}

}  // namespace

std::span<const MemoryKindInfo> MemoryKinds() { return Kinds(); }

const MemoryKindInfo* FindMemoryKind(int32_t device_type) {
  for (const MemoryKindInfo& kind : Kinds()) {
    if (kind.device_type == device_type) return &kind;
  }
  return nullptr;
}

std::string DeviceName(DLDevice device) { return common::DeviceName(device.device_type, device.device_id); }

Result<DLDevice> ParseDeviceName(std::string_view text) {
  const size_t colon = text.find(':');
  const std::string_view prefix = text.substr(0, colon);
  const common::MemoryKind* kind = common::FindMemoryKindByPrefix(prefix);
  int32_t id = 0;
  bool valid = kind != nullptr && kind->own_memory;
  if (valid && colon != std::string_view::npos) {
    const std::string_view digits = text.substr(colon + 1);
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), id);
    valid = !digits.empty() && digits.front() != '-' && error == std::errc() && end == digits.data() + digits.size();
  }
  if (!valid) {
    return Status(StatusCode::kInvalidArgument,
                  "device '" + std::string(text) + "': give " + DeviceForms() + " (N: this process's ordinal)");
  }
  return DLDevice{static_cast<DLDeviceType>(kind->type), id};
}

}  // namespace tensord
