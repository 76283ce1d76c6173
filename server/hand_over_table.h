// HandOverTable: the pending lease hand-overs. A hand-over is a one-time bearer token for a
// tensor, made by a session that holds a lease on it and redeemed by any session that may
// read the tensor (the Broker checks). While pending it holds its tensor for the broker
// (Tensor::hand_overs), bound to no session: its maker may exit before the receiver comes.
// It ends when redeemed, when its TTL runs out (its timer), or with the broker. Each one
// counts against its maker's uid (CountFor) and the lease it was made from (CountForLease,
// at most kMaxHandOversPerLease). Tokens are keys here only; never log one.
// Not thread-safe: the Broker guards it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

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

 private:
  absl::flat_hash_map<std::string, PendingHandOver> pending_;
  absl::flat_hash_map<uid_t, size_t> per_uid_;
  absl::flat_hash_map<uint64_t, size_t> per_lease_;
};

}  // namespace tensord::server
