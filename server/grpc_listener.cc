#include "server/grpc_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/server_posix.h"
#include "server/unix_socket.h"
#include "spdlog/spdlog.h"

namespace tensord::server {
namespace {

// Numbers below stay for everything else (memfds of buffers, epoll, files).
constexpr int kRotateFirst = 1024;
constexpr int kRotateSpan = 65536;
constexpr int kMinRotateSpan = 1024;

}  // namespace

absl::Status GrpcListener::Start(const std::string& path, mode_t mode, gid_t group, grpc::Server* server) {
  server_ = server;
  path_ = path;
  TENSORD_ASSIGN_OR_RETURN(listen_fd_, ListenUnix(path, SOCK_STREAM, mode, group));
  wake_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) return common::ErrnoToStatus("gRPC listener eventfd", errno);
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    rlim_t end = std::min<rlim_t>(limit.rlim_cur, kRotateFirst + kRotateSpan);
    if (end >= static_cast<rlim_t>(kRotateFirst + kMinRotateSpan)) {
      rotate_first_ = rotate_next_ = kRotateFirst;
      rotate_end_ = static_cast<int>(end);
    }
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void GrpcListener::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  if (write(wake_fd_.get(), &one, sizeof(one)) < 0) {
    spdlog::warn("gRPC listener: cannot wake the accept thread: {}", std::strerror(errno));
  }
  thread_.join();
  listen_fd_.reset();
  unlink(path_.c_str());
}

std::optional<common::PeerCredentials> GrpcListener::Lookup(std::string_view peer) const {
  int fd = -1;
  if (!peer.starts_with("fd:") || !absl::SimpleAtoi(common::AbslView(peer.substr(3)), &fd)) {
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(fd);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

int GrpcListener::MoveToRotatingNumber(int fd) {
  if (rotate_end_ == 0) return fd;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, rotate_next_);
    if (moved >= 0 && moved < rotate_end_) {
      close(fd);
      rotate_next_ = moved + 1 >= rotate_end_ ? rotate_first_ : moved + 1;
      return moved;
    }
    if (moved >= 0) close(moved);
    rotate_next_ = rotate_first_;  // nothing free up to the end: wrap around
  }
  return fd;
}

void GrpcListener::Run() {
  Acceptor acceptor;
  pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("gRPC listener: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    while (true) {
      bool shed = false;
      common::UniqueFd connection = acceptor.Accept(listen_fd_.get(), &shed);
      if (!connection) {
        if (shed) continue;
        break;
      }
      absl::StatusOr<common::PeerCredentials> creds = common::GetPeerCredentials(connection.get());
      if (!creds.ok()) {
        spdlog::warn("gRPC listener: {}", creds.status().ToString());
        continue;
      }
      int fd = MoveToRotatingNumber(connection.release());
      {
        absl::MutexLock lock(&mu_);
        peers_[fd] = *creds;
      }
      // gRPC owns the fd from here on and closes it with the connection.
      grpc::AddInsecureChannelFromFd(server_, fd);
    }
  }
}

}  // namespace tensord::server
