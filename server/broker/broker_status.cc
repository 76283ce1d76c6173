// The Broker's status: backends, devices, quotas, and the per-session and per-namespace rows
// a caller may see (StatusScopeLocked: a caller's own uid's unless it is root or the
// daemon's uid).
#include <unistd.h>

#include <chrono>
#include <optional>

#include "common/memory/device_names.h"
#include "common/status.h"
#include "server/broker/broker.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

v1::StatusResponse Broker::GetStatus(const v1::StatusRequest& request, uint64_t session_id) {
  v1::StatusResponse response;
  response.set_version(options_.version);
  response.set_instance_nonce(instance_nonce_);
  response.set_pid(static_cast<uint32_t>(getpid()));
  response.set_uid(static_cast<uint32_t>(getuid()));
  response.set_socket(options_.socket);
  auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  response.set_uptime_ms(now - started_unix_ms_);
  absl::MutexLock lock(&mu_);
  response.set_host_bytes_in_use(memory_quota_.InUse(MemoryQuota::kHost));
  response.set_host_bytes_limit(memory_quota_.Limit(MemoryQuota::kHost));
  response.set_tensors(registry_.tensors().size());
  response.set_named_tensors(registry_.names().size());
  response.set_buffers(registry_.buffer_count());
  response.set_leases(leases_.size());
  response.set_sessions(sessions_.size());
  response.set_releases_not_found(releases_not_found_);
  response.set_host_bytes_pooled(pool_.bytes_on(&backends_->host()));
  response.set_pooled_buffers(pool_.size());
  response.set_hand_overs_pending(hand_overs_.size());
  response.set_leases_reclaimed(leases_reclaimed_);
  if (request.include_sessions()) DescribeSessionsLocked(session_id, response);
  if (request.include_namespaces()) DescribeNamespacesLocked(session_id, response);
  if (request.include_queues()) DescribeQueuesLocked(session_id, response);
  DescribeHandOversLocked(session_id, response);
  for (v1::BackendStatus& backend : backends_->Describe()) {
    for (v1::DeviceUsage& usage : *backend.mutable_devices()) {
      const std::string key = common::DeviceKey(usage.device());
      usage.set_bytes_in_use(memory_quota_.InUse(key));
      usage.set_bytes_limit(memory_quota_.Limit(key));
      if (absl::StatusOr<const ResolvedDevice*> device = backends_->Resolve(usage.device()); device.ok()) {
        usage.set_bytes_pooled(pool_.bytes_on(*device));
      }
    }
    *response.add_backends() = std::move(backend);
  }
  return response;
}

bool Broker::StatusScopeLocked(uint64_t session_id, std::optional<uid_t>& only_uid) {
  only_uid.reset();
  if (session_id == 0) return true;
  const Session* caller = sessions_.Find(session_id);
  if (caller == nullptr) return false;
  const uid_t uid = caller->creds.uid;
  if (uid != 0 && uid != options_.daemon_uid) only_uid = uid;
  return true;
}

void Broker::DescribeSessionsLocked(uint64_t session_id, v1::StatusResponse& response) {
  std::optional<uid_t> only_uid;  // nullopt: every session
  if (!StatusScopeLocked(session_id, only_uid)) return;
  // Running figures (UsageCounters): the cost is the sessions', whatever the tensor count.
  for (const auto& [id, session] : sessions_.sessions()) {
    if (only_uid && session.creds.uid != *only_uid) continue;
    v1::SessionUsage& usage = *response.add_session_usage();
    usage.set_id(id);
    usage.set_pid(static_cast<uint32_t>(session.creds.pid));
    usage.set_uid(session.creds.uid);
    usage.set_gid(session.creds.gid);
    usage.set_client_name(session.client_name);
    usage.set_opened_unix_ms(session.opened_unix_ms);
    usage.set_leases(leases_.CountOf(session.id));
    // A tensor leased twice holds its bytes once.
    const UsageCounters::SessionFigures figures = registry_.usage().ForSession(id);
    usage.set_bytes_leased(figures.bytes_leased);
    usage.set_tensors_produced(figures.tensors_produced);
    usage.set_bytes_produced(figures.bytes_produced);
    usage.set_leases_granted(session.leases_granted);
    usage.set_publishes(session.publishes);
    usage.set_waiting(session.waits);
  }
}

void Broker::DescribeNamespacesLocked(uint64_t session_id, v1::StatusResponse& response) {
  // A caller learns of a namespace only what List and Watch would show it: that it exists,
  // and its tensors' count and bytes, only where it may read.
  const common::PeerCredentials* caller = nullptr;
  if (session_id != 0) {
    const Session* session = sessions_.Find(session_id);
    if (session == nullptr) return;
    caller = &session->creds;
  }
  // Running figures (UsageCounters): the cost is the namespaces', whatever the tensor count.
  std::map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> usage;  // sorted output
  for (const auto& [key, figures] : registry_.usage().namespaces()) {
    if (caller != nullptr && !access_.MayReadIn(*caller, key.ns, key.producer_uid)) continue;
    auto& [tensors, bytes] = usage[{key.ns, key.device == nullptr ? std::string("host") : key.device->key}];
    tensors += figures.tensors;
    bytes += figures.bytes;
  }
  for (const auto& [key, value] : usage) {
    v1::NamespaceUsage& entry = *response.add_namespace_usage();
    entry.set_namespace_(key.first);
    entry.set_device(key.second);
    entry.set_tensors(value.first);
    entry.set_bytes(value.second);
  }
}

}  // namespace tensord::server
