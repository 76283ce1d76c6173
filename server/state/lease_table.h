// LeaseTable: every live lease (one hold on one tensor by one session). A lease is usable
// only by its session: Remove with another session's id finds nothing. Lease ids are never
// reused within a broker instance. Not thread-safe: the Broker guards it.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/container/flat_hash_map.h"

namespace tensord::server {

struct Lease {
  uint64_t tensor_id = 0;
  uint64_t session_id = 0;
};

class LeaseTable {
 public:
  uint64_t Add(uint64_t session_id, uint64_t tensor_id) {
    uint64_t id = ++last_id_;
    leases_.emplace(id, Lease{tensor_id, session_id});
    return id;
  }
  // The lease, or null when `session_id` does not hold `lease_id`.
  const Lease* Find(uint64_t lease_id, uint64_t session_id) const {
    auto it = leases_.find(lease_id);
    return it == leases_.end() || it->second.session_id != session_id ? nullptr : &it->second;
  }
  // The removed lease, or nullopt when `session_id` does not hold `lease_id`.
  std::optional<Lease> Remove(uint64_t lease_id, uint64_t session_id) {
    auto it = leases_.find(lease_id);
    if (it == leases_.end() || it->second.session_id != session_id) return std::nullopt;
    Lease lease = it->second;
    leases_.erase(it);
    return lease;
  }
  size_t size() const { return leases_.size(); }

 private:
  uint64_t last_id_ = 0;
  absl::flat_hash_map<uint64_t, Lease> leases_;
};

}  // namespace tensord::server
