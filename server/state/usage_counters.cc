#include "server/state/usage_counters.h"

#include "common/check.h"

namespace tensord::server {

UsageCounters::NamespaceKey UsageCounters::KeyOf(std::string_view ns, const ResolvedDevice* device,
                                                 uid_t producer_uid) {
  return NamespaceKey{std::string(ns), device, ns.empty() ? producer_uid : 0};
}

void UsageCounters::AddTensor(std::string_view ns, const ResolvedDevice* device, uid_t producer_uid,
                              uint64_t producer_session, uint64_t bytes) {
  Figures& row = namespaces_[KeyOf(ns, device, producer_uid)];
  ++row.tensors;
  row.bytes += bytes;
  if (producer_session == 0) return;
  SessionFigures& session = sessions_[producer_session];
  ++session.tensors_produced;
  session.bytes_produced += bytes;
}

void UsageCounters::RemoveTensor(std::string_view ns, const ResolvedDevice* device, uid_t producer_uid,
                                 uint64_t producer_session, uint64_t bytes) {
  auto row = namespaces_.find(KeyOf(ns, device, producer_uid));
  TENSORD_CHECK(row != namespaces_.end() && row->second.tensors > 0 && row->second.bytes >= bytes);
  --row->second.tensors;
  row->second.bytes -= bytes;
  if (row->second.tensors == 0) namespaces_.erase(row);
  if (producer_session == 0) return;
  auto session = sessions_.find(producer_session);
  TENSORD_CHECK(session != sessions_.end() && session->second.tensors_produced > 0 &&
                session->second.bytes_produced >= bytes);
  --session->second.tensors_produced;
  session->second.bytes_produced -= bytes;
  DropSessionIfEmpty(producer_session);
}

// No entry holds only zeroes, so a recount, which makes none, compares equal.
void UsageCounters::AddHolder(uint64_t session_id, uint64_t bytes) {
  if (bytes != 0) sessions_[session_id].bytes_leased += bytes;
}

void UsageCounters::RemoveHolder(uint64_t session_id, uint64_t bytes) {
  if (bytes == 0) return;
  auto session = sessions_.find(session_id);
  TENSORD_CHECK(session != sessions_.end() && session->second.bytes_leased >= bytes);
  session->second.bytes_leased -= bytes;
  DropSessionIfEmpty(session_id);
}

UsageCounters::SessionFigures UsageCounters::ForSession(uint64_t session_id) const {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? SessionFigures{} : it->second;
}

void UsageCounters::DropSessionIfEmpty(uint64_t session_id) {
  auto session = sessions_.find(session_id);
  if (session != sessions_.end() && session->second == SessionFigures{}) sessions_.erase(session);
}

}  // namespace tensord::server
