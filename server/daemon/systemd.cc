#include "server/daemon/systemd.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/names.h"
#include "common/status.h"
#include "server/daemon/fd_store.h"
#include "spdlog/spdlog.h"

namespace tensord::server {
namespace {

constexpr std::chrono::seconds kStatusPeriodWithoutWatchdog{10};

const char* TypeName(int type) {
  switch (type) {
    case SOCK_STREAM: return "SOCK_STREAM";
    case SOCK_SEQPACKET: return "SOCK_SEQPACKET";
    case SOCK_DGRAM: return "SOCK_DGRAM";
    default: return "a socket of another type";
  }
}

}  // namespace

absl::StatusOr<PassedFds> TakePassedFds() {
  // absl::StrCat takes absl::string_view, which Debian's abseil does not alias to std's.
  const std::string kGrpcName(kGrpcSocketName), kFdChannelName(kFdChannelSocketName);
  char** raw_names = nullptr;
  // 1: unset LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES, which are for this process only.
  const int count = sd_listen_fds_with_names(1, &raw_names);
  std::vector<std::string> names;
  if (raw_names != nullptr) {
    for (char** name = raw_names; *name != nullptr; ++name) {
      names.emplace_back(*name);
      std::free(*name);
    }
    std::free(raw_names);
  }
  if (count < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket activation: LISTEN_FDS cannot be used: ", std::strerror(-count)));
  }
  PassedFds passed;
  if (count == 0) return passed;
  // Own every fd first, so that each is closed whatever is wrong with another.
  std::vector<common::UniqueFd> fds;
  for (int i = 0; i < count; ++i) fds.emplace_back(SD_LISTEN_FDS_START + i);

  std::optional<ListeningSocket> grpc, fd_channel;
  for (int i = 0; i < count; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    const std::string name = i < static_cast<int>(names.size()) ? names[i] : "";
    const std::string what = absl::StrCat("socket-activation fd ", fd,
                                          name.empty() ? std::string() : absl::StrCat(" (", common::QuoteForError(name), ")"));
    if (IsStoredStateName(name)) {
      passed.stored[name].push_back(std::move(fds[i]));
      continue;
    }
    const int type = SocketOption(fd, SO_TYPE);
    std::string role;
    if (name == kGrpcSocketName || name == kFdChannelSocketName) {
      role = name;
    } else if (name.empty() || name == "unknown") {  // "unknown": systemd's name for an unnamed fd
      if (type == SOCK_STREAM) role = kGrpcName;
      if (type == SOCK_SEQPACKET) role = kFdChannelName;
      if (role.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, " is ", TypeName(type), ": tensord takes a SOCK_STREAM socket (gRPC) and a SOCK_SEQPACKET one (fd channel)"));
      }
    } else {
      return absl::FailedPreconditionError(absl::StrCat(what, " has a name tensord does not know: it takes '",
                                                        kGrpcName, "' and '", kFdChannelName, "'"));
    }
    const int want = role == kGrpcName ? SOCK_STREAM : SOCK_SEQPACKET;
    if (type != want) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " is ", TypeName(type), ": the '", role, "' socket must be ", TypeName(want)));
    }
    std::optional<ListeningSocket>& slot = role == kGrpcName ? grpc : fd_channel;
    if (slot.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": a second '", role, "' socket"));
    }
    // The socket files are systemd's: they stay when the daemon stops.
    TENSORD_ASSIGN_OR_RETURN(ListeningSocket socket, AdoptListening(std::move(fds[i]), want, what, false));
    slot = std::move(socket);
  }
  if (!grpc.has_value() && !fd_channel.has_value()) return passed;  // the fd store's only
  if (!grpc.has_value() || !fd_channel.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "socket activation passed ", count, " socket(s) but no '", !grpc ? kGrpcName : kFdChannelName,
        "' socket: tensord needs both, the gRPC socket (SOCK_STREAM) and the fd channel (SOCK_SEQPACKET); "
        "deploy/systemd has units that pass both"));
  }
  passed.sockets = ActivationSockets{std::move(*grpc), std::move(*fd_channel)};
  return passed;
}

SystemdNotifier::SystemdNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  enabled_ = socket != nullptr && socket[0] != '\0';
  uint64_t usec = 0;
  if (enabled_ && sd_watchdog_enabled(0, &usec) > 0) watchdog_ = std::chrono::microseconds(usec);
}

void SystemdNotifier::Send(const std::string& state) {
  if (!enabled_) return;
  int result = sd_notify(0, state.c_str());
  if (result < 0) spdlog::warn("systemd notify ({}): {}", state.substr(0, state.find('\n')), std::strerror(-result));
}

void SystemdNotifier::Ready(StatusText status) {
  if (!enabled_) return;
  Send(absl::StrCat("READY=1\nSTATUS=", status()));
  if (watchdog_.count() > 0) {
    spdlog::info("systemd watchdog: a keep-alive every {} ms", watchdog_.count() / 2000);
  }
  const absl::Duration period = watchdog_.count() > 0 ? absl::Microseconds(watchdog_.count() / 2)
                                                      : absl::FromChrono(kStatusPeriodWithoutWatchdog);
  const bool watchdog = watchdog_.count() > 0;
  heartbeat_ = std::thread([this, status = std::move(status), period, watchdog] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) return;
      }
      Send(absl::StrCat("STATUS=", status(), watchdog ? "\nWATCHDOG=1" : ""));
    }
  });
}

void SystemdNotifier::StopHeartbeat() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (heartbeat_.joinable()) heartbeat_.join();
}

void SystemdNotifier::Stopping(std::string_view why) {
  StopHeartbeat();
  Send(absl::StrCat("STOPPING=1\nSTATUS=", std::string(why)));
}

}  // namespace tensord::server
