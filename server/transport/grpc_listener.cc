#include "server/transport/grpc_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/server_posix.h"
#include "server/transport/unix_socket.h"
#include "spdlog/spdlog.h"

namespace tensord::server {
namespace {

// Numbers below stay for everything else (memfds of buffers, epoll, files).
constexpr int kRotateFirst = 1024;
constexpr int kRotateSpan = 65536;
constexpr int kMinRotateSpan = 1024;

constexpr auto kMinSweepInterval = std::chrono::milliseconds(100);

// Tells a gRPC client why its connection is refused before closing it: the server preface
// (an empty SETTINGS frame), then a GOAWAY with ENHANCE_YOUR_CALM and `reason` as debug text.
void SendGoAway(int fd, std::string_view reason) {
  reason = reason.substr(0, 512);
  std::string frames;
  auto header = [&](uint32_t length, uint8_t type) {
    frames += static_cast<char>((length >> 16) & 0xff);
    frames += static_cast<char>((length >> 8) & 0xff);
    frames += static_cast<char>(length & 0xff);
    frames += static_cast<char>(type);
    frames.append(5, '\0');  // flags, stream 0
  };
  header(0, 0x4);  // SETTINGS
  header(static_cast<uint32_t>(8 + reason.size()), 0x7);  // GOAWAY
  frames.append(4, '\0');                                 // last stream id 0
  frames += std::string("\0\0\0\x0b", 4);               // ENHANCE_YOUR_CALM
  frames += reason;
  (void)send(fd, frames.data(), frames.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  // What the client sent already is read first: closing a Unix socket with unread data
  // makes the client's reads fail at once, before it reads the GOAWAY.
  std::array<char, 4096> sink;
  while (recv(fd, sink.data(), sink.size(), MSG_DONTWAIT) > 0) {
  }
}

}  // namespace

absl::Status GrpcListener::Start(ListeningSocket socket, grpc::Server* server, ConnectionCaps caps) {
  server_ = server;
  socket_ = std::move(socket);
  {
    absl::MutexLock lock(&mu_);
    limits_.emplace("gRPC socket", std::move(caps));
  }
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
  ListeningSocket socket = Release();
  socket.Close();
}

ListeningSocket GrpcListener::Release() {
  if (!thread_.joinable()) return {};
  uint64_t one = 1;
  if (write(wake_fd_.get(), &one, sizeof(one)) < 0) {
    spdlog::warn("gRPC listener: cannot wake the accept thread: {}", std::strerror(errno));
  }
  thread_.join();
  return std::exchange(socket_, ListeningSocket{});
}

std::optional<common::PeerCredentials> GrpcListener::Lookup(std::string_view peer) const {
  int fd = -1;
  if (!peer.starts_with("fd:") || !absl::SimpleAtoi(common::AbslView(peer.substr(3)), &fd)) {
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(fd);
  if (it == peers_.end()) return std::nullopt;
  return it->second.creds;
}

void GrpcListener::SweepClosedLocked() {
  last_sweep_ = std::chrono::steady_clock::now();
  for (auto it = peers_.begin(); it != peers_.end();) {
    struct stat st {};
    if (fstat(it->first, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == it->second.inode) {
      ++it;
      continue;
    }
    limits_->Leave(it->second.creds.uid);
    peers_.erase(it++);
  }
}

absl::Status GrpcListener::Admit(uid_t uid) {
  absl::MutexLock lock(&mu_);
  absl::Status admitted = limits_->Admit(uid);
  if (admitted.ok() || std::chrono::steady_clock::now() - last_sweep_ < kMinSweepInterval) return admitted;
  SweepClosedLocked();
  return limits_->Admit(uid);
}

absl::Status GrpcListener::CheckRoomFor(uid_t uid) {
  absl::MutexLock lock(&mu_);
  if (!limits_) return absl::OkStatus();
  absl::Status room = limits_->CheckRoom(uid);
  if (room.ok() || std::chrono::steady_clock::now() - last_sweep_ < kMinSweepInterval) return room;
  SweepClosedLocked();
  return limits_->CheckRoom(uid);
}

void GrpcListener::Track(int fd, const common::PeerCredentials& creds, ino_t inode) {
  absl::MutexLock lock(&mu_);
  auto [it, added] = peers_.try_emplace(fd, Peer{creds, inode});
  if (!added) {
    // The number was free again, so gRPC closed the connection that had it.
    limits_->Leave(it->second.creds.uid);
    it->second = Peer{creds, inode};
  }
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
  pollfd fds[2] = {{socket_.fd.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("gRPC listener: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    while (true) {
      bool shed = false;
      common::UniqueFd connection = acceptor.Accept(socket_.fd.get(), &shed);
      if (!connection) {
        if (shed) continue;
        break;
      }
      absl::StatusOr<common::PeerCredentials> creds = common::GetPeerCredentials(connection.get());
      struct stat st {};
      if (!creds.ok() || fstat(connection.get(), &st) != 0) {
        spdlog::warn("gRPC listener: {}", creds.ok() ? std::strerror(errno) : creds.status().ToString());
        continue;
      }
      if (absl::Status admitted = Admit(creds->uid); !admitted.ok()) {
        spdlog::debug("gRPC listener: pid {} refused: {}", creds->pid, std::string(admitted.message()));
        SendGoAway(connection.get(), absl::StrCat("RESOURCE_EXHAUSTED: ", admitted.message()));
        continue;  // closed here
      }
      int fd = MoveToRotatingNumber(connection.release());
      Track(fd, *creds, st.st_ino);
      // gRPC owns the fd from here on and closes it with the connection.
      grpc::AddInsecureChannelFromFd(server_, fd);
    }
  }
}

}  // namespace tensord::server
