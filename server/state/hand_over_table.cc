#include "server/state/hand_over_table.h"

#include <utility>

#include "common/check.h"
#include "common/status.h"

namespace tensord::server {

void HandOverTable::Add(std::string token, PendingHandOver hand_over) {
  const uid_t uid = hand_over.uid;
  const bool added = pending_.emplace(std::move(token), hand_over).second;
  TENSORD_CHECK(added);
  HandOverPins& pins = by_uid_[uid];
  ++pins.hand_overs;
  if (++pins_[{uid, hand_over.tensor_id}] == 1) (hand_over.host ? pins.host_bytes : pins.device_bytes) += hand_over.bytes;
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
  const uid_t uid = hand_over.uid;
  pending_.erase(it);
  auto pins = by_uid_.find(uid);
  TENSORD_CHECK(pins != by_uid_.end() && pins->second.hand_overs > 0);
  --pins->second.hand_overs;
  auto pin = pins_.find({uid, hand_over.tensor_id});
  TENSORD_CHECK(pin != pins_.end() && pin->second > 0);
  if (--pin->second == 0) {
    pins_.erase(pin);
    uint64_t& bytes = hand_over.host ? pins->second.host_bytes : pins->second.device_bytes;
    TENSORD_CHECK(bytes >= hand_over.bytes);
    bytes -= hand_over.bytes;
  }
  if (pins->second.hand_overs == 0) by_uid_.erase(pins);
  auto of_lease = per_lease_.find(hand_over.lease_id);
  TENSORD_CHECK(of_lease != per_lease_.end() && of_lease->second > 0);
  if (--of_lease->second == 0) per_lease_.erase(of_lease);
  return hand_over;
}

size_t HandOverTable::CountFor(uid_t uid) const { return PinsOf(uid).hand_overs; }

size_t HandOverTable::CountForLease(uint64_t lease_id) const {
  auto it = per_lease_.find(lease_id);
  return it == per_lease_.end() ? 0 : it->second;
}

HandOverPins HandOverTable::PinsOf(uid_t uid) const {
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? HandOverPins{} : it->second;
}

std::vector<std::string> HandOverTable::TokensOf(uid_t uid) const {
  std::vector<std::string> tokens;
  if (!by_uid_.contains(uid)) return tokens;
  for (const auto& [token, hand_over] : pending_) {
    if (hand_over.uid == uid) tokens.push_back(token);
  }
  return tokens;
}

}  // namespace tensord::server
