#include "common/fd_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tensord::common {
namespace {

absl::Status PeerClosed() { return absl::UnavailableError("peer closed the fd channel"); }

// Ancillary-data buffer for `n` fds, aligned as cmsghdr requires.
std::vector<uint64_t> ControlBuffer(size_t n) {
  size_t bytes = n == 0 ? 0 : CMSG_SPACE(n * sizeof(int));
  return std::vector<uint64_t>((bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t));
}

// Takes ownership of every fd in SCM_RIGHTS messages at once, so that every later
// failure closes them.
void CollectFds(msghdr* msg, std::vector<UniqueFd>* fds) {
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(c);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, data + i * sizeof(int), sizeof(int));
      fds->emplace_back(fd);
    }
  }
}

ssize_t RecvmsgRetrying(int socket, msghdr* msg) {
  ssize_t n;
  do {
    n = ::recvmsg(socket, msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  return n;
}

}  // namespace

absl::StatusOr<FdIo> SendFdMessage(int socket, const google::protobuf::MessageLite& message,
                                   std::span<const int> fds) {
  size_t size = message.ByteSizeLong();
  if (size > kMaxFdMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("fd channel: ", message.GetTypeName(),
                                                   " of ", size, " bytes exceeds the ",
                                                   kMaxFdMessageBytes, "-byte limit"));
  }
  // A zero-length datagram reads as end-of-file on SOCK_SEQPACKET.
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd channel: an empty ", message.GetTypeName(),
        " cannot be sent (a zero-length datagram reads as the peer closing)"));
  }
  if (fds.size() > kMaxFdsPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat("fd channel: ", fds.size(),
                                                   " fds in one message, at most ",
                                                   kMaxFdsPerMessage));
  }
  std::string bytes = message.SerializeAsString();
  iovec iov{bytes.data(), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<uint64_t> control = ControlBuffer(fds.size());
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  ssize_t sent;
  do {
    // MSG_NOSIGNAL: a vanished peer is an error to report, not a SIGPIPE.
    sent = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) {
    if (errno == EPIPE || errno == ECONNRESET) return PeerClosed();
    if (errno == EAGAIN || errno == EWOULDBLOCK) return FdIo::kWouldBlock;
    return ErrnoToStatus(absl::StrCat("fd channel: send ", message.GetTypeName()), errno);
  }
  // SOCK_SEQPACKET sends a datagram whole or not at all.
  if (static_cast<size_t>(sent) != bytes.size()) {
    return absl::InternalError(absl::StrCat("fd channel: sent ", sent, " of ", bytes.size(),
                                            " bytes of ", message.GetTypeName()));
  }
  return FdIo::kDone;
}

absl::StatusOr<ReceivedMessage> ReceiveFdMessage(int socket, size_t max_fds) {
  if (max_fds > kMaxFdsPerMessage) max_fds = kMaxFdsPerMessage;
  ReceivedMessage received;
  received.bytes.resize(kMaxFdMessageBytes);
  iovec iov{received.bytes.data(), received.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for max_fds only: the kernel drops the surplus of a larger batch and sets
  // MSG_CTRUNC, so a hostile peer cannot fill our fd table.
  std::vector<uint64_t> control = ControlBuffer(max_fds);
  if (max_fds > 0) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(max_fds * sizeof(int));
  }
  ssize_t n = RecvmsgRetrying(socket, &msg);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      ReceivedMessage nothing;
      nothing.io = FdIo::kWouldBlock;
      return nothing;
    }
    if (errno == ECONNRESET) return PeerClosed();
    return ErrnoToStatus("fd channel: receive", errno);
  }
  CollectFds(&msg, &received.fds);
  if (n == 0 && received.fds.empty() && (msg.msg_flags & MSG_CTRUNC) == 0) return PeerClosed();
  if (msg.msg_flags & MSG_TRUNC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd channel: message longer than ", kMaxFdMessageBytes, " bytes refused"));
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    // Fewer fds than we had room for means the kernel could not install them (our fd
    // table is full); a full buffer means the peer sent more than allowed.
    if (received.fds.size() < max_fds) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "fd channel: only ", received.fds.size(),
          " fds of a message arrived (fd table full? raise RLIMIT_NOFILE)"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "fd channel: message carried more than the ", max_fds, " fds expected; refused"));
  }
  if (received.fds.size() > max_fds) {
    return absl::InvalidArgumentError(absl::StrCat("fd channel: message carried ",
                                                   received.fds.size(), " fds, at most ",
                                                   max_fds, " expected; refused"));
  }
  received.bytes.resize(static_cast<size_t>(n));
  return received;
}

absl::Status ParseFdMessage(const ReceivedMessage& received,
                            google::protobuf::MessageLite* message) {
  if (received.io == FdIo::kWouldBlock) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fd channel: no ", message->GetTypeName(), " to parse: the receive would have blocked"));
  }
  if (!message->ParseFromString(received.bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd channel: malformed ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int socket) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoToStatus("getsockopt(SO_PEERCRED)", errno);
  }
  return PeerCredentials{cred.uid, cred.gid, cred.pid};
}

namespace {

// A connected SOCK_CLOEXEC Unix socket of `type`; `what` names the socket in errors.
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path, int type, std::string_view what) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is ", path.size(),
                                                   " bytes: must be 1 to ",
                                                   sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoToStatus(absl::StrCat(AbslView(what), ": socket(AF_UNIX)"), errno);
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  // A connect interrupted after the kernel queued it reports EISCONN on the retry.
  if (rc != 0 && errno != EISCONN) {
    int err = errno;
    if (err == ENOENT || err == ECONNREFUSED) {
      return absl::UnavailableError(absl::StrCat(AbslView(what), " ", path,
                                                 ": no daemon listens there (",
                                                 std::strerror(err), ")"));
    }
    return ErrnoToStatus(absl::StrCat(AbslView(what), ": connect to ", path), err);
  }
  return fd;
}

}  // namespace

absl::StatusOr<UniqueFd> ConnectSeqpacket(const std::string& path) {
  return ConnectUnix(path, SOCK_SEQPACKET, "fd channel");
}

absl::StatusOr<UniqueFd> ConnectStream(const std::string& path) {
  return ConnectUnix(path, SOCK_STREAM, "gRPC socket");
}

bool PeerHungUp(int socket) {
  pollfd pfd{socket, POLLRDHUP, 0};
  int rc;
  do {
    rc = ::poll(&pfd, 1, 0);
  } while (rc < 0 && errno == EINTR);
  return rc > 0 && (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace tensord::common
