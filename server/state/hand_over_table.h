// HandOverTable: the pending lease hand-overs. A hand-over is a one-time bearer token for a
// tensor, made by a session that holds a lease on it and redeemed by any session that may
// read the tensor (the Broker checks). While pending it holds its tensor for the broker
// (Tensor::hand_overs), bound to no session: its maker may exit before the receiver comes.
// It ends when redeemed, when its TTL runs out (its timer), when its maker's uid cancels it,
// or with the broker. Each one counts against its maker's uid (CountFor) and the lease it
// was made from (CountForLease, at most kMaxHandOversPerLease).
//
// Pins: the memory a pending hand-over holds alive counts against its maker's uid, once per
// (uid, tensor) however many tokens that uid has pending on the tensor, until the last of
// them ends (Pins, PinsOf). The Broker charges UidQuota by the same rule.
// Tokens are keys here only; never log one.
// Not thread-safe: the Broker guards it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tensord::server {

// The most hand-overs one lease may have pending: plenty for one tensor pickled to every
// worker of a pool, and a bound on what one lease can make the daemon keep.
inline constexpr size_t kMaxHandOversPerLease = 1024;

struct PendingHandOver {
  uint64_t tensor_id = 0;
  uid_t uid = 0;            // the maker's, charged for it
  uint64_t timer_id = 0;    // its expiry (TimerQueue)
  uint64_t lease_id = 0;    // the lease it was made from (lease ids are never reused)
  // The memory of its tensor (a dedicated buffer's size, an arena slot's length), in host
  // memory or on a device: what it pins. Constant: a published tensor keeps its memory.
  uint64_t bytes = 0;
  bool host = true;
  // Of those, what its maker's uid is charged (UidResource::kHostBytes) while the uid pins
  // the tensor: host memory not charged to the uid already as the tensor's producer.
  uint64_t charged_host_bytes = 0;
};

// What one uid's pending hand-overs hold.
struct HandOverPins {
  size_t hand_overs = 0;
  uint64_t host_bytes = 0, device_bytes = 0;  // each tensor once
};

class HandOverTable {
 public:
  // The token must be new (a 256-bit random one is).
  void Add(std::string token, PendingHandOver hand_over);
  const PendingHandOver* Find(std::string_view token) const;
  // The removed hand-over, or nullopt when the token is not pending.
  std::optional<PendingHandOver> Remove(std::string_view token);
  size_t CountFor(uid_t uid) const;
  size_t CountForLease(uint64_t lease_id) const;
  size_t size() const { return pending_.size(); }
  // Whether `uid` has a hand-over pending on `tensor_id`: one more pins nothing new, and
  // after a Remove, false says the pin ended.
  bool Pins(uid_t uid, uint64_t tensor_id) const { return pins_.contains({uid, tensor_id}); }
  HandOverPins PinsOf(uid_t uid) const;
  // Every uid with a hand-over pending.
  const absl::flat_hash_map<uid_t, HandOverPins>& pins_by_uid() const { return by_uid_; }
  // The tokens `uid` has pending (to cancel them): O(every pending hand-over), which a
  // second index of the tokens would avoid at the cost of keeping each token twice.
  std::vector<std::string> TokensOf(uid_t uid) const;

 private:
  absl::flat_hash_map<std::string, PendingHandOver> pending_;
  absl::flat_hash_map<uid_t, HandOverPins> by_uid_;
  absl::flat_hash_map<uint64_t, size_t> per_lease_;
  absl::flat_hash_map<std::pair<uid_t, uint64_t>, size_t> pins_;  // (uid, tensor) -> tokens
};

}  // namespace tensord::server
