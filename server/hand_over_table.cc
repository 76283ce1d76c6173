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
  return hand_over;
}

size_t HandOverTable::CountFor(uid_t uid) const {
  auto it = per_uid_.find(uid);
  return it == per_uid_.end() ? 0 : it->second;
}

}  // namespace tensord::server
