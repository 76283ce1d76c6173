// The tensorctl commands, one function each, called by main.cc once the command line is
// parsed. Each prints its answer on stdout (human text, or with --json the JSON documents of
// json_output.h) and returns the process's exit code; a failure has printed its one line
// with Fail (command_support.h) by then.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "client/cli/command_support.h"
#include "tensord/client.h"

namespace tensord::cli {

// tensor_commands.cc: names and the tensors bound to them.
int CmdLs(Client& client, const GlobalFlags& flags, const std::string& prefix);
int CmdStat(Client& client, const GlobalFlags& flags, const std::string& name);
// Publishes the .npy file at `path` under `name`.
int CmdPut(Client& client, const GlobalFlags& flags, const std::string& name, const std::string& path);
// Acquires `name` read-only, waiting up to `wait_seconds` (infinity: forever) for it to be
// bound; writes it to the .npy file `out` unless that is empty.
int CmdGet(Client& client, const GlobalFlags& flags, const std::string& name, const std::string& out,
           std::optional<double> wait_seconds);
// Unbinds `name`, or with a trailing '/' every name under that prefix.
int CmdRm(Client& client, const GlobalFlags& flags, const std::string& name);
// Prints binding changes under `prefix` until SIGINT or SIGTERM.
int CmdWatch(Client& client, const GlobalFlags& flags, const std::string& prefix);

// broker_commands.cc: the daemon as a whole.
int CmdStatus(Client& client, const GlobalFlags& flags);
// The bounded work queues the caller may read: depth, tensors in each, who waits.
int CmdQueues(Client& client, const GlobalFlags& flags);
// Refreshes every `interval_seconds` until SIGINT or SIGTERM, or `iterations` (0: no limit).
int CmdTop(Client& client, const GlobalFlags& flags, double interval_seconds, uint64_t iterations);
// Asks the daemon's grpc.health.v1 service about `service` (empty: the server), opening no
// session; exits 0 only for SERVING.
int CmdHealth(const GlobalFlags& flags, const std::string& service, double timeout_seconds);

}  // namespace tensord::cli
