#include "server/access/connection_limits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status.h"

namespace tensord::server {

bool ConnectionLimits::Exempt(uid_t uid) const {
  return std::find(caps_.exempt_uids.begin(), caps_.exempt_uids.end(), uid) != caps_.exempt_uids.end();
}

uint64_t ConnectionLimits::of_uid(uid_t uid) const {
  auto it = per_uid_.find(uid);
  return it == per_uid_.end() ? 0 : it->second;
}

absl::Status ConnectionLimits::CheckRoom(uid_t uid) const {
  if (caps_.total != 0 && total_ >= caps_.total) {
    return absl::ResourceExhaustedError(absl::StrCat(socket_name_, ": ", total_,
                                                     " connections are open, the limit (", caps_.total_flag,
                                                     " ", caps_.total, ")"));
  }
  const uint64_t mine = of_uid(uid);
  if (caps_.per_uid != 0 && mine >= caps_.per_uid && !Exempt(uid)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        socket_name_, ": uid ", uid, " has ", mine, " connections open, the limit per uid (--max-connections-per-uid ",
        caps_.per_uid, ")"));
  }
  return absl::OkStatus();
}

absl::Status ConnectionLimits::Admit(uid_t uid) {
  TENSORD_RETURN_IF_ERROR(CheckRoom(uid));
  ++per_uid_[uid];
  ++total_;
  return absl::OkStatus();
}

void ConnectionLimits::Leave(uid_t uid) {
  auto it = per_uid_.find(uid);
  TENSORD_CHECK(it != per_uid_.end() && it->second > 0 && total_ > 0);
  --total_;
  if (--it->second == 0) per_uid_.erase(it);
}

}  // namespace tensord::server
