#include "server/hand_over_table.h"

#include <utility>

#include "common/check.h"
#include "common/status.h"

namespace tensord::server {

void HandOverTable::Add(std::string token, PendingHandOver hand_over) {
  const uid_t uid = hand_over.uid;
  const bool added = pending_.emplace(std::move(token), hand_over).second;
  TENSORD_CHECK(added);
  ++per_uid_[uid];
  ++per_lease_[hand_over.lease_id];
}

const PendingHandOver* HandOverTable::Find(std::string_view token) const {
  auto it = pending_.find(common::AbslView(token));
  return it == pending_.end() ? nullptr : &it->second;
}

std::optional<PendingHandOver> HandOverTable::Remove(std::string_view token) {
  auto it = pending_.find(common::AbslView(token));
  if (it == pending_.end()) return std::nullopt;
  PendingHandOver hand_over = it->second;
  pending_.erase(it);
  auto count = per_uid_.find(hand_over.uid);
  TENSORD_CHECK(count != per_uid_.end() && count->second > 0);
  if (--count->second == 0) per_uid_.erase(count);
  auto of_lease = per_lease_.find(hand_over.lease_id);
  TENSORD_CHECK(of_lease != per_lease_.end() && of_lease->second > 0);
  if (--of_lease->second == 0) per_lease_.erase(of_lease);
  return hand_over;
}

size_t HandOverTable::CountFor(uid_t uid) const {
  auto it = per_uid_.find(uid);
  return it == per_uid_.end() ? 0 : it->second;
}

size_t HandOverTable::CountForLease(uint64_t lease_id) const {
  auto it = per_lease_.find(lease_id);
  return it == per_lease_.end() ? 0 : it->second;
}

}  // namespace tensord::server
