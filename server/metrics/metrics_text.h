// The daemon's metrics in Prometheus' text exposition format (version 0.0.4), every name
// prefixed tensord_: the broker's counts, memory by device and by namespace, leases
// reclaimed from clients that ended without releasing, and the RPC counts and latencies.
// docs/deployment.md lists them.
#pragma once

#include <string>

#include "server/metrics/rpc_metrics.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::server {

// What this daemon took over when it started (a take-over or systemd's fd store).
struct StartedWith {
  std::string from;  // "take-over", "fd-store", or empty: it started empty
  uint64_t tensors = 0, refused = 0;
};

// `status` as Broker::GetStatus answers a request with include_namespaces.
std::string PrometheusText(const tensord::v1::StatusResponse& status, const RpcMetrics& rpcs,
                           const StartedWith& started = {});

}  // namespace tensord::server
