// The Watch stream (tensord.v1.Broker/Watch): binding changes under a prefix, as events.
// A watcher that stops reading gets a single KIND_RESET once it catches up instead of an
// unbounded backlog (at most 4096 events are queued). Initial bindings (WatchRequest.initial)
// do not count against that: the broker reads them a page at a time, each page once the
// queue runs low, so any number of them arrives whole.
#pragma once

#include <cstdint>

#include <memory>

#include "absl/status/statusor.h"
#include "server/broker/broker.h"
#include "server/transport/async_server.h"

namespace tensord::server {

// One Watch call; `session` is the authenticated session or why there is none. It reads the
// WatchRequest (one that does not decode finishes the call with INVALID_ARGUMENT).
std::unique_ptr<ServerCall> NewWatchStream(Broker* broker, absl::StatusOr<uint64_t> session);

}  // namespace tensord::server
