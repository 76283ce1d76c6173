// The Session stream (tensord.v1.Broker/Session): the hot path. Requests are answered in
// order of completion, each reply carrying its request's seq; the Broker's pushes (a tensor
// retired, an export released, a cache reset) ride the same stream. Backpressure: the
// stream stops reading requests while too many replies wait to be written, and a push
// queue that overflows is
// replaced by a single cache_reset, so a client that stops reading costs the daemon a
// bounded amount of memory. A message that does not decode ends the stream with
// INVALID_ARGUMENT (never as if the client had half-closed it).
// Batches: a SessionRequest.batch is dispatched request by request with writes held back,
// and messages queued back to back (a batch's replies, pushes, any that pile up behind a
// write) leave in order as one SessionResponse.batch, so N requests cost one read and one
// write instead of N each.
#pragma once

#include <cstdint>

#include <memory>

#include "absl/status/statusor.h"
#include "server/broker/broker.h"
#include "server/metrics/rpc_metrics.h"
#include "server/transport/async_server.h"

namespace tensord::server {

// One Session call, carried as raw bytes; `session` is the authenticated session or why
// there is none. Its requests are counted in `metrics` (may be null).
std::unique_ptr<ServerCall> NewSessionStream(Broker* broker, absl::StatusOr<uint64_t> session,
                                             RpcMetrics* metrics = nullptr);

}  // namespace tensord::server
