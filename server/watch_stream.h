// The Watch stream (tensord.v1.Broker/Watch): binding changes under a prefix, as events.
// A watcher that stops reading gets a single KIND_RESET once it catches up instead of an
// unbounded backlog (at most 4096 events are queued).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "server/broker.h"

namespace tensord::server {

// A reactor for one Watch call; `request` is the raw WatchRequest (parsed here: one that
// does not decode finishes the call with INVALID_ARGUMENT). gRPC owns the reactor.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewWatchStream(Broker* broker, absl::StatusOr<uint64_t> session,
                                                          const grpc::ByteBuffer& request);

}  // namespace tensord::server
