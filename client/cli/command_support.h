// What every tensorctl command shares: the global flags, the exit codes, the one line a
// failure prints, the connection to the broker, and how a command that runs until Ctrl-C
// learns that it should stop.
//
// A command reports a failure once, with Fail(): exactly one line on stderr, "tensorctl:
// <what>: <message>", where <what> names the command and its object ("get ns/x") and the
// message says why; it exits kExitUsage for a usage error and kExitError for anything else.
// Single-threaded, as tensorctl is (the signal handler only sets a flag).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensord/client.h"

namespace tensord::cli {

inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

// The flags taken before or after any command.
struct GlobalFlags {
  std::string socket;  // empty: the client's default (DefaultClientSocketPath)
  std::vector<uint32_t> trusted_daemon_uids;
  bool json = false;
};

// Prints "tensorctl: <what>: <message>" as one line (a newline in either becomes a space)
// and returns `exit_code`.
int Fail(const std::string& what, const std::string& message, int exit_code = kExitError);
// The same with the status's message, or its code's name when it has none.
int Fail(const std::string& what, const Status& status);

// A session named "tensorctl", without the lease cache: a one-shot process releases at once.
Result<std::unique_ptr<Client>> ConnectFromFlags(const GlobalFlags& flags);

// For commands that run until Ctrl-C (watch, top): from here on SIGINT and SIGTERM only make
// Interrupted() true, so the command ends cleanly, and stdout is line-buffered, so each
// line goes out as it is printed.
void EndOnSignal();
bool Interrupted();

}  // namespace tensord::cli
