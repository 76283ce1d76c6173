// systemd integration through Debian's libsystemd: socket activation (sd_listen_fds(3)) and
// the notify protocol (sd_notify(3): READY=1, STATUS=, WATCHDOG=1, STOPPING=1). Outside
// systemd (no LISTEN_FDS, no NOTIFY_SOCKET) none of it does anything, so the daemon runs the
// same by hand. deploy/systemd has the units; docs/deployment.md says how to use them.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <vector>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/transport/unix_socket.h"

namespace tensord::server {

// The names the units give the daemon's two sockets (FileDescriptorName=).
inline constexpr std::string_view kGrpcSocketName = "grpc";
inline constexpr std::string_view kFdChannelSocketName = "fd-channel";

struct ActivationSockets {
  ListeningSocket grpc;        // SOCK_STREAM
  ListeningSocket fd_channel;  // SOCK_SEQPACKET
};

// What systemd passed this process (LISTEN_FDS and LISTEN_PID naming it): the sockets, and
// the fds the daemon kept in the fd store (fd_store.h), by name.
struct PassedFds {
  std::optional<ActivationSockets> sockets;
  std::map<std::string, std::vector<common::UniqueFd>> stored;
};

// The sockets systemd passed this process (LISTEN_FDS and LISTEN_PID naming it), taken by
// name: kGrpcSocketName and kFdChannelSocketName. Unnamed ones ("unknown", as a unit without
// FileDescriptorName= or a test harness passes them) are told apart by type. Each must be a
// listening AF_UNIX socket bound to a path, of its role's type; the fds become non-blocking
// and close-on-exec, and the LISTEN_* variables are unset so no child inherits them. The
// sockets' files are systemd's and stay when the daemon stops (remove_on_close false).
// `sockets` is nullopt when the daemon was not socket-activated. Fds with the fd store's
// names (IsStoredStateName) go to `stored`, untouched. FAILED_PRECONDITION naming the fd and
// what is wrong with it otherwise; every passed fd is closed then.
absl::StatusOr<PassedFds> TakePassedFds();

// Tells the service manager (NOTIFY_SOCKET) how the daemon is doing. Every call does nothing
// when the daemon does not run under a manager that listens. Thread-safe.
class SystemdNotifier {
 public:
  using StatusText = std::function<std::string()>;

  SystemdNotifier();
  ~SystemdNotifier() { StopHeartbeat(); }
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  bool enabled() const { return enabled_; }
  // The keep-alive interval systemd asked for (WatchdogSec=, WATCHDOG_USEC); zero: none.
  std::chrono::microseconds watchdog_interval() const { return watchdog_; }

  // READY=1 with a STATUS= line, then a heartbeat thread: every half watchdog interval (or
  // every 10 s without a watchdog) it sends STATUS=`status()` and, with a watchdog,
  // WATCHDOG=1. A keep-alive is sent only after `status()` returns, and `status()` asks the
  // broker, so a wedged broker stops the keep-alives and systemd restarts the daemon.
  void Ready(StatusText status);
  // Stops the heartbeat, then sends STOPPING=1 with STATUS=`why`.
  void Stopping(std::string_view why);

 private:
  void Send(const std::string& state);
  void StopHeartbeat();

  bool enabled_ = false;
  std::chrono::microseconds watchdog_{0};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_;
};

}  // namespace tensord::server
