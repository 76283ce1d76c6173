#include "server/daemon/take_over.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/status.h"
#include "server/state/registry_snapshot.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

// Below the kernel's SCM_RIGHTS limit (253).
constexpr size_t kFdsPerMessage = 200;

absl::Status Send(int socket, const v1::TakeOverMessage& message, std::span<const int> fds = {}) {
  absl::StatusOr<common::FdIo> sent = common::SendFdMessage(socket, message, fds);
  if (!sent.ok()) return sent.status();
  return absl::OkStatus();
}

// The next message, within kTakeOverStepTimeout, with at most `max_fds` fds.
absl::StatusOr<common::ReceivedMessage> Receive(int socket, size_t max_fds, v1::TakeOverMessage* message) {
  pollfd p{socket, POLLIN, 0};
  int ready = poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kTakeOverStepTimeout).count()));
  if (ready < 0) return common::ErrnoToStatus("take-over: poll", errno);
  if (ready == 0) {
    return absl::DeadlineExceededError(absl::StrCat("take-over: no word from the other daemon within ",
                                                    kTakeOverStepTimeout.count(), " s"));
  }
  TENSORD_ASSIGN_OR_RETURN(common::ReceivedMessage received, common::ReceiveFdMessage(socket, max_fds));
  TENSORD_RETURN_IF_ERROR(common::ParseFdMessage(received, message));
  return received;
}

}  // namespace

std::string TakeOverPath(const std::string& socket) { return socket + ".takeover"; }

absl::Status TakenOver::Serving() {
  v1::TakeOverMessage message;
  message.set_serving(true);
  return Send(connection.get(), message);
}

absl::StatusOr<TakenOver> TakeOverFrom(const std::string& socket) {
  const std::string path = TakeOverPath(socket);
  absl::StatusOr<common::UniqueFd> connection = common::ConnectSeqpacket(path);
  if (!connection.ok()) {
    return absl::UnavailableError(absl::StrCat("--take-over: no running tensord hands over at ", path, ": ",
                                               connection.status().message()));
  }
  // Only root or this daemon's own uid may hand a daemon over, as only they may take one
  // over (HandOverSession::ReadRequest): a socket another uid bound in a shared directory
  // gets nothing, not even the request, and hands nothing over.
  TENSORD_ASSIGN_OR_RETURN(common::PeerCredentials peer, common::GetPeerCredentials(connection->get()));
  if (peer.uid != 0 && peer.uid != getuid()) {
    return absl::PermissionDeniedError(absl::StrCat("--take-over: ", path, " is served by pid ", peer.pid,
                                                    " of uid ", peer.uid, ", not root or this daemon's uid ",
                                                    getuid(), ": refusing to take anything over from it"));
  }
  TakenOver out;
  out.connection = *std::move(connection);
  const int fd = out.connection.get();
  v1::TakeOverMessage request;
  request.set_request(kTakeOverProtocolVersion);
  TENSORD_RETURN_IF_ERROR(Send(fd, request));

  v1::TakeOverMessage message;
  TENSORD_ASSIGN_OR_RETURN(common::ReceivedMessage first, Receive(fd, 3, &message));
  if (message.has_refused()) {
    return absl::FailedPreconditionError(absl::StrCat("--take-over: the running tensord refused: ", message.refused()));
  }
  if (!message.has_state() || first.fds.size() != 3) {
    return absl::FailedPreconditionError("--take-over: the running tensord sent no state with its three fds");
  }
  out.state = message.state();
  TENSORD_ASSIGN_OR_RETURN(out.snapshot, ReadSnapshotMemfd(first.fds[0].get()));
  // The socket files are this daemon's from now on.
  TENSORD_ASSIGN_OR_RETURN(out.grpc, AdoptListening(std::move(first.fds[1]), SOCK_STREAM,
                                                    "take-over: the gRPC socket", true));
  TENSORD_ASSIGN_OR_RETURN(out.fd_channel, AdoptListening(std::move(first.fds[2]), SOCK_SEQPACKET,
                                                          "take-over: the fd-channel socket", true));
  while (true) {
    TENSORD_ASSIGN_OR_RETURN(common::ReceivedMessage next, Receive(fd, kFdsPerMessage, &message));
    if (message.has_end()) break;
    if (!message.has_buffer_fds() || message.buffer_fds() != next.fds.size()) {
      return absl::FailedPreconditionError("--take-over: a malformed message among the buffer fds");
    }
    for (common::UniqueFd& buffer_fd : next.fds) out.buffer_fds.push_back(std::move(buffer_fd));
  }
  if (out.buffer_fds.size() != out.state.buffer_fds()) {
    return absl::FailedPreconditionError(absl::StrCat("--take-over: ", out.buffer_fds.size(),
                                                      " buffer fds came, the state announced ",
                                                      out.state.buffer_fds()));
  }
  return out;
}

absl::Status HandOverSession::ReadRequest() {
  TENSORD_ASSIGN_OR_RETURN(common::PeerCredentials peer, common::GetPeerCredentials(connection_.get()));
  if (peer.uid != 0 && peer.uid != getuid()) {
    Refuse(absl::StrCat("uid ", peer.uid, " may not take over a daemon of uid ", getuid()));
    return absl::PermissionDeniedError(absl::StrCat("take-over asked by pid ", peer.pid, " of uid ", peer.uid));
  }
  v1::TakeOverMessage message;
  TENSORD_ASSIGN_OR_RETURN(common::ReceivedMessage received, Receive(connection_.get(), 0, &message));
  if (!message.has_request() || message.request() != kTakeOverProtocolVersion) {
    const std::string why = absl::StrCat("take-over protocol ", message.request(), "; this tensord speaks ",
                                         kTakeOverProtocolVersion);
    Refuse(why);
    return absl::FailedPreconditionError(why);
  }
  spdlog::info("take-over asked by pid {} (uid {})", peer.pid, peer.uid);
  return absl::OkStatus();
}

absl::Status HandOverSession::Send(const v1::TakeOverState& state, int snapshot_fd, int grpc_fd, int fd_channel_fd,
                                   const std::vector<common::UniqueFd>& buffer_fds) {
  v1::TakeOverMessage message;
  *message.mutable_state() = state;
  message.mutable_state()->set_buffer_fds(static_cast<uint32_t>(buffer_fds.size()));
  const int first[] = {snapshot_fd, grpc_fd, fd_channel_fd};
  TENSORD_RETURN_IF_ERROR(server::Send(connection_.get(), message, first));
  for (size_t at = 0; at < buffer_fds.size(); at += kFdsPerMessage) {
    std::vector<int> fds;
    for (size_t i = at; i < std::min(buffer_fds.size(), at + kFdsPerMessage); ++i) fds.push_back(buffer_fds[i].get());
    v1::TakeOverMessage chunk;
    chunk.set_buffer_fds(static_cast<uint32_t>(fds.size()));
    TENSORD_RETURN_IF_ERROR(server::Send(connection_.get(), chunk, fds));
  }
  v1::TakeOverMessage end;
  end.set_end(true);
  return server::Send(connection_.get(), end);
}

absl::Status HandOverSession::AwaitServing() {
  v1::TakeOverMessage message;
  TENSORD_ASSIGN_OR_RETURN(common::ReceivedMessage received, Receive(connection_.get(), 0, &message));
  if (!message.has_serving()) return absl::FailedPreconditionError("take-over: the new daemon did not say it serves");
  return absl::OkStatus();
}

void HandOverSession::Refuse(const std::string& why) {
  v1::TakeOverMessage message;
  message.set_refused(why);
  if (absl::Status sent = server::Send(connection_.get(), message); !sent.ok()) {
    spdlog::debug("take-over: cannot tell the other daemon why not: {}", sent.ToString());
  }
}

absl::Status TakeOverListener::Start(const std::string& socket, Handler handler) {
  handler_ = std::move(handler);
  TENSORD_ASSIGN_OR_RETURN(socket_, ListenUnix(TakeOverPath(socket), SOCK_SEQPACKET, 0600, static_cast<gid_t>(-1)));
  wake_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) {
    socket_.Close();
    return common::ErrnoToStatus("take-over listener eventfd", errno);
  }
  thread_ = std::thread([this] {
    while (true) {
      pollfd fds[2] = {{socket_.fd.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        spdlog::error("take-over listener: poll: {}", std::strerror(errno));
        return;
      }
      if (fds[1].revents != 0) return;
      common::UniqueFd connection(accept4(socket_.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (connection) handler_(std::move(connection));
    }
  });
  return absl::OkStatus();
}

void TakeOverListener::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  if (write(wake_fd_.get(), &one, sizeof(one)) < 0) {
    spdlog::warn("take-over listener: cannot wake its thread: {}", std::strerror(errno));
  }
  thread_.join();
  socket_.Close();
}

}  // namespace tensord::server
