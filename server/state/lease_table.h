// LeaseTable: every live lease (one hold on one tensor by one session) and what follows from
// it, kept by one owner so that none of it can disagree: the tensor's lease count and holders
// (through TensorRegistry, which also counts the bytes each session holds), the session's
// leases and its count of grants, and the holder uid's metadata charge (UidQuota). Grant and
// Drop are the only ways a lease comes and goes.
//
// The caller checks the caps before a Grant (the broker's CheckLeaseLimitsLocked) and decides
// what a tensor that nothing holds any more becomes. A lease is usable only by its session:
// Drop or Find with another session's id finds nothing. Lease ids are never reused within a
// broker instance. Not thread-safe: the Broker guards it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "server/access/uid_quota.h"
#include "server/state/session_manager.h"
#include "server/state/tensor_registry.h"

namespace tensord::server {

struct Lease {
  uint64_t tensor_id = 0;
  uint64_t session_id = 0;
};

class LeaseTable {
 public:
  LeaseTable(TensorRegistry& registry, UidQuota& uid_quota) : registry_(registry), uid_quota_(uid_quota) {}

  // A new lease of `session` on `tensor`; `by_name`: acquired by its name, so the session
  // hears when the name moves on (Tensor::name_holders). Returns the lease's id.
  uint64_t Grant(Session& session, Tensor& tensor, bool by_name = false);
  // The lease, or null when `session_id` does not hold `lease_id`.
  const Lease* Find(uint64_t lease_id, uint64_t session_id) const;
  // Drops `session`'s lease `lease_id`: the tensor it held, with its count and holders
  // already updated, or null when the session holds no such lease.
  Tensor* Drop(const Session& session, uint64_t lease_id);
  // Drops every lease of `session` (it is closing): the ids of the tensors they held, one per
  // lease. Look each up again: dropping what one of them frees may free another.
  std::vector<uint64_t> DropAll(const Session& session);

  size_t CountOf(uint64_t session_id) const;
  size_t size() const { return leases_.size(); }

 private:
  Tensor& Release(const Lease& lease, uid_t holder_uid);

  TensorRegistry& registry_;
  UidQuota& uid_quota_;
  uint64_t last_id_ = 0;
  absl::flat_hash_map<uint64_t, Lease> leases_;
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> by_session_;  // session -> lease ids
};

}  // namespace tensord::server
