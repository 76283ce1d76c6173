// Daemon: everything `tensord` does between parsing its configuration and exiting: the
// socket directory and lock, the fd channel, the gRPC server (Broker, health, reflection),
// and the SIGTERM drain (stop accepting, finish in-flight calls within 5 s, exit 0).
#pragma once

#include "absl/status/status.h"
#include "server/daemon/config.h"

namespace tensord::server {

// Serves until SIGTERM or SIGINT. The caller blocks those signals in every thread first
// (BlockTerminationSignals) so that only the daemon's sigwait sees them.
absl::Status RunDaemon(const Config& config);
void BlockTerminationSignals();

}  // namespace tensord::server
