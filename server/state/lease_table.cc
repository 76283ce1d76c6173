#include "server/state/lease_table.h"

#include "common/check.h"

namespace tensord::server {

uint64_t LeaseTable::Grant(Session& session, Tensor& tensor, bool by_name) {
  const uint64_t id = ++last_id_;
  leases_.emplace(id, Lease{tensor.id, session.id});
  by_session_[session.id].insert(id);
  ++session.leases_granted;
  uid_quota_.Add(session.creds.uid, UidResource::kMetadataBytes, kLeaseEntryBytes);
  registry_.AddHolder(tensor, session.id, by_name);
  ++tensor.leases;
  return id;
}

const Lease* LeaseTable::Find(uint64_t lease_id, uint64_t session_id) const {
  auto it = leases_.find(lease_id);
  return it == leases_.end() || it->second.session_id != session_id ? nullptr : &it->second;
}

Tensor* LeaseTable::Drop(const Session& session, uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.session_id != session.id) return nullptr;
  const Lease lease = it->second;
  leases_.erase(it);
  auto held = by_session_.find(session.id);
  TENSORD_CHECK(held != by_session_.end() && held->second.erase(lease_id) == 1);
  if (held->second.empty()) by_session_.erase(held);
  return &Release(lease, session.creds.uid);
}

std::vector<uint64_t> LeaseTable::DropAll(const Session& session) {
  std::vector<uint64_t> tensors;
  auto held = by_session_.find(session.id);
  if (held == by_session_.end()) return tensors;
  tensors.reserve(held->second.size());
  for (uint64_t lease_id : held->second) {
    auto it = leases_.find(lease_id);
    TENSORD_CHECK(it != leases_.end());
    tensors.push_back(Release(it->second, session.creds.uid).id);
    leases_.erase(it);
  }
  by_session_.erase(held);
  return tensors;
}

size_t LeaseTable::CountOf(uint64_t session_id) const {
  auto held = by_session_.find(session_id);
  return held == by_session_.end() ? 0 : held->second.size();
}

Tensor& LeaseTable::Release(const Lease& lease, uid_t holder_uid) {
  uid_quota_.Release(holder_uid, UidResource::kMetadataBytes, kLeaseEntryBytes);
  Tensor* tensor = registry_.Find(lease.tensor_id);
  TENSORD_CHECK(tensor != nullptr && tensor->leases > 0);
  --tensor->leases;
  registry_.RemoveHolder(*tensor, lease.session_id);
  return *tensor;
}

}  // namespace tensord::server
