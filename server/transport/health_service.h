// HealthService: gRPC's standard health checking (grpc.health.v1.Health) on the AsyncServer,
// for grpc_health_probe, Kubernetes' gRPC probes and grpcurl. Needs no session.
//
// The server as a whole ("") and every service it names are SERVING until SetNotServing
// (the daemon calls it when it starts draining); any other name is unknown: Check answers
// NOT_FOUND, Watch sends SERVICE_UNKNOWN. A Watch call gets the current status, then the
// change to NOT_SERVING, after which its stream ends (OK) so that it does not hold up the
// server's shutdown. Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "server/transport/async_server.h"

namespace tensord::server {

class HealthWatch;

class HealthService {
 public:
  explicit HealthService(std::vector<std::string> services) : services_(std::move(services)) {}

  // Routes Check and Watch on `server` here. The service must outlive the server.
  void Register(AsyncServer* server);
  // Every service is NOT_SERVING from now on; watchers are told and their streams end.
  void SetNotServing();

  // The status of `service` (a grpc.health.v1.HealthCheckResponse.ServingStatus).
  int StatusOf(const std::string& service) const;

 private:
  friend class HealthWatch;
  // Sends `watch` its first status and adds it; false when nothing serves any more (the
  // watch then ends after that status).
  bool AddWatcher(HealthWatch* watch);
  int StatusLocked(const std::string& service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveWatcher(HealthWatch* watch);

  const std::vector<std::string> services_;
  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = true;
  absl::flat_hash_set<HealthWatch*> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::server
