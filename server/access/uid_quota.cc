#include "server/access/uid_quota.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/human_bytes.h"
#include "common/status.h"

namespace tensord::server {

namespace {

std::string_view Noun(UidResource resource) {
  switch (resource) {
    case UidResource::kSessions: return "sessions";
    case UidResource::kTensors: return "tensors";
    case UidResource::kWaits: return "pending acquires and takes";
    case UidResource::kWatchers: return "watchers";
    case UidResource::kMetadataBytes: return "bytes of daemon memory for metadata";
    case UidResource::kHostBytes:
      return "bytes of host memory (its buffers outside ACL'd namespaces, and what its pending hand-overs pin)";
  }
  return "units";
}

}  // namespace

UidQuota::UidQuota(UidLimits limits, std::vector<uid_t> exempt_uids)
    : limits_(limits), exempt_uids_(std::move(exempt_uids)) {}

bool UidQuota::Exempt(uid_t uid) const {
  return std::find(exempt_uids_.begin(), exempt_uids_.end(), uid) != exempt_uids_.end();
}

std::string_view UidQuota::FlagName(UidResource resource) {
  switch (resource) {
    case UidResource::kSessions: return "--max-sessions-per-uid";
    case UidResource::kTensors: return "--max-tensors-per-uid";
    case UidResource::kWaits: return "--max-waits-per-uid";
    case UidResource::kWatchers: return "--max-watchers-per-uid";
    case UidResource::kMetadataBytes: return "--max-metadata-bytes-per-uid";
    case UidResource::kHostBytes: return "--max-host-bytes-per-uid";
  }
  return "";
}

absl::Status UidQuota::CheckRoom(uid_t uid, UidResource resource, uint64_t amount, std::string_view what) const {
  const uint64_t held = InUse(uid, resource);
  const uint64_t limit = limits_[resource];
  if (limit == 0 || Exempt(uid) || (amount <= limit && held <= limit - amount)) return absl::OkStatus();
  // Byte counts also as people read them ("6291456 (6.0 MiB)"); the flag's value stays exact.
  const bool bytes = resource == UidResource::kMetadataBytes || resource == UidResource::kHostBytes;
  auto count = [bytes](uint64_t n) {
    return bytes && n >= 1024 ? absl::StrCat(n, " (", common::HumanBytes(n), ")") : absl::StrCat(n);
  };
  return absl::ResourceExhaustedError(absl::StrCat(
      common::AbslView(what), " needs ", count(amount), " more ", common::AbslView(Noun(resource)), ": uid ", uid,
      " holds ", count(held), " of the limit per uid (", common::AbslView(FlagName(resource)), " ", limit,
      bytes && limit >= 1024 ? absl::StrCat(", ", common::HumanBytes(limit)) : "", ")"));
}

absl::Status UidQuota::Reserve(uid_t uid, UidResource resource, uint64_t amount, std::string_view what) {
  TENSORD_RETURN_IF_ERROR(CheckRoom(uid, resource, amount, what));
  Add(uid, resource, amount);
  return absl::OkStatus();
}

void UidQuota::Add(uid_t uid, UidResource resource, uint64_t amount) {
  if (amount == 0) return;
  use_[uid][static_cast<size_t>(resource)] += amount;
}

void UidQuota::Release(uid_t uid, UidResource resource, uint64_t amount) {
  if (amount == 0) return;
  auto it = use_.find(uid);
  TENSORD_CHECK(it != use_.end());
  uint64_t& held = it->second[static_cast<size_t>(resource)];
  TENSORD_CHECK(held >= amount);
  held -= amount;
  if (std::all_of(it->second.begin(), it->second.end(), [](uint64_t n) { return n == 0; })) {
    use_.erase(it);
  }
}

uint64_t UidQuota::InUse(uid_t uid, UidResource resource) const {
  auto it = use_.find(uid);
  return it == use_.end() ? 0 : it->second[static_cast<size_t>(resource)];
}

}  // namespace tensord::server
