#include "client/fd_connection.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <string_view>
#include <utility>

#include "client/status_util.h"
#include "common/fd_channel.h"
#include "common/status.h"

namespace tensord::internal {

absl::Status CheckDaemonUid(uid_t daemon_uid, uid_t our_uid, std::span<const uint32_t> trusted_uids,
                            const std::string& path) {
  if (daemon_uid == 0 || daemon_uid == our_uid) return absl::OkStatus();
  for (uint32_t uid : trusted_uids) {
    if (uid == daemon_uid) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      "the daemon at " + path + " runs as uid " + std::to_string(daemon_uid) +
      ", which is neither root, our uid " + std::to_string(our_uid) +
      ", nor in trusted_daemon_uids ($TENSORD_TRUSTED_DAEMON_UIDS)");
}

namespace {

// The socket is made blocking and poll() comes before each receive, so only someone who
// set O_NONBLOCK on our fd behind our back gets here.
absl::Status WouldBlock(std::string_view what, uint64_t seq) {
  return absl::InternalError("fd channel: could not " + std::string(what) + " request " +
                             std::to_string(seq) + " without blocking (someone made the socket non-blocking)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdConnection>> FdConnection::Connect(
    const std::string& fd_path, const std::string& client_name,
    std::span<const uint32_t> trusted_uids, std::chrono::milliseconds reply_timeout) {
  TENSORD_ASSIGN_OR_RETURN(common::UniqueFd socket, common::ConnectSeqpacket(fd_path));
  TENSORD_ASSIGN_OR_RETURN(common::PeerCredentials peer, common::GetPeerCredentials(socket.get()));
  TENSORD_RETURN_IF_ERROR(CheckDaemonUid(peer.uid, ::getuid(), trusted_uids, fd_path));

  std::unique_ptr<FdConnection> conn(new FdConnection(std::move(socket), reply_timeout));
  conn->daemon_ = peer;
  tensord::v1::FdRequest hello;
  hello.mutable_hello()->set_protocol_version(common::kFdProtocolVersion);
  hello.mutable_hello()->set_client_name(client_name);
  absl::StatusOr<tensord::v1::FdResponse> reply;
  {
    absl::MutexLock lock(&conn->mu_);
    reply = conn->Call(std::move(hello), {}, 0, nullptr);
  }
  if (!reply.ok()) return Annotate(reply.status(), "fd channel hello");
  if (!reply->has_welcome()) {
    return absl::InternalError("fd channel hello: the broker answered without a welcome");
  }
  if (reply->welcome().protocol_version() != common::kFdProtocolVersion) {
    return absl::FailedPreconditionError(
        "fd channel hello: the broker speaks protocol " +
        std::to_string(reply->welcome().protocol_version()) + ", this client " +
        std::to_string(common::kFdProtocolVersion));
  }
  if (reply->welcome().session_token().empty()) {
    return absl::InternalError("fd channel hello: the broker sent no session token");
  }
  conn->welcome_ = reply->welcome();
  return conn;
}

absl::StatusOr<tensord::v1::FdResponse> FdConnection::Call(tensord::v1::FdRequest request,
                                                           std::span<const int> fds,
                                                           size_t max_fds,
                                                           std::vector<common::UniqueFd>* fds_out) {
  if (broken_.load(std::memory_order_acquire) || !socket_.valid()) {
    return absl::UnavailableError("fd channel is closed");
  }
  const uint64_t seq = next_seq_++;
  request.set_seq(seq);
  TENSORD_RETURN_IF_ERROR(SendRequest(request, fds, seq));
  absl::StatusOr<common::ReceivedMessage> received = ReceiveReply(seq, max_fds);
  if (!received.ok()) return received.status();
  return AcceptReply(*received, seq, fds_out);
}

absl::Status FdConnection::SendRequest(const tensord::v1::FdRequest& request, std::span<const int> fds,
                                       uint64_t seq) {
  absl::StatusOr<common::FdIo> sent = common::SendFdMessage(socket_.get(), request, fds);
  if (!sent.ok()) {
    if (sent.status().code() != absl::StatusCode::kInvalidArgument) broken_.store(true);
    return sent.status();
  }
  if (*sent == common::FdIo::kWouldBlock) {
    broken_.store(true);
    return WouldBlock("send", seq);
  }
  return absl::OkStatus();
}

absl::StatusOr<common::ReceivedMessage> FdConnection::ReceiveReply(uint64_t seq, size_t max_fds) {
  // One request in flight, so the next datagram is its reply; wait for it with a bound so
  // a wedged broker cannot hang this thread forever while it holds mu_.
  pollfd pfd{socket_.get(), POLLIN, 0};
  int timeout_ms = static_cast<int>(reply_timeout_.count());
  int rc;
  do {
    rc = ::poll(&pfd, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) {
    broken_.store(true);
    return common::ErrnoToStatus("poll fd channel", errno);
  }
  if (rc == 0) {
    broken_.store(true);
    return absl::DeadlineExceededError("the broker did not answer on the fd channel within " +
                                       std::to_string(reply_timeout_.count()) + " ms");
  }
  absl::StatusOr<common::ReceivedMessage> received = common::ReceiveFdMessage(socket_.get(), max_fds);
  if (!received.ok()) {
    broken_.store(true);
    return received;
  }
  if (received->io == common::FdIo::kWouldBlock) {
    broken_.store(true);
    return WouldBlock("receive the reply to", seq);
  }
  return received;
}

absl::StatusOr<tensord::v1::FdResponse> FdConnection::AcceptReply(common::ReceivedMessage& received, uint64_t seq,
                                                                  std::vector<common::UniqueFd>* fds_out) {
  tensord::v1::FdResponse response;
  absl::Status parsed = common::ParseFdMessage(received, &response);
  if (!parsed.ok()) {
    broken_.store(true);
    return parsed;
  }
  if (response.seq() != seq) {
    broken_.store(true);
    return absl::InternalError("fd channel: reply seq " + std::to_string(response.seq()) +
                               " does not match request " + std::to_string(seq));
  }
  if (response.has_error()) {
    if (!received.fds.empty()) {
      return absl::InternalError("fd channel: an error reply carried fds");
    }
    return ToAbsl(FromRpcError(response.error()));
  }
  if (fds_out != nullptr) {
    *fds_out = std::move(received.fds);
  } else if (!received.fds.empty()) {
    // Unexpected fds close when Call drops `received`; refuse the message.
    return absl::InternalError("fd channel: unexpected fds in the reply");
  }
  return response;
}

absl::StatusOr<std::vector<common::FetchedBuffer>> FdConnection::Fetch(std::span<const uint64_t> buffer_ids) {
  std::vector<common::FetchedBuffer> out;
  out.reserve(buffer_ids.size());
  while (out.size() < buffer_ids.size()) {
    const std::span<const uint64_t> ask =
        buffer_ids.subspan(out.size(), std::min(common::kMaxFdsPerMessage, buffer_ids.size() - out.size()));
    tensord::v1::FdRequest request;
    for (uint64_t id : ask) request.mutable_fetch()->add_buffer_ids(id);
    std::vector<common::UniqueFd> fds;
    absl::StatusOr<tensord::v1::FdResponse> reply;
    {
      absl::MutexLock lock(&mu_);
      reply = Call(std::move(request), {}, common::kMaxFdsPerMessage, &fds);
    }
    if (!reply.ok()) return reply.status();
    TENSORD_RETURN_IF_ERROR(TakeFetched(ask, *reply, fds, out));
  }
  return out;
}

absl::Status FdConnection::TakeFetched(std::span<const uint64_t> ask, const tensord::v1::FdResponse& reply,
                                       std::vector<common::UniqueFd>& fds,
                                       std::vector<common::FetchedBuffer>& out) {
  if (!reply.has_fetched()) return absl::InternalError("fetch: the broker answered without buffers");
  const auto& buffers = reply.fetched().buffers();
  // The broker may answer fewer buffers than asked (to stay within 253 fds), never none.
  if (buffers.empty() || static_cast<size_t>(buffers.size()) > ask.size()) {
    return absl::InternalError("fetch: asked for " + std::to_string(ask.size()) + " buffers, got " +
                               std::to_string(buffers.size()));
  }
  size_t next_fd = 0;
  for (int i = 0; i < buffers.size(); ++i) {
    const tensord::v1::FetchedBuffer& entry = buffers[i];
    if (entry.buffer_id() != ask[static_cast<size_t>(i)]) {
      return absl::InternalError("fetch: asked for buffer " + std::to_string(ask[static_cast<size_t>(i)]) +
                                 ", got " + std::to_string(entry.buffer_id()));
    }
    const size_t count = entry.handle().fd_count();
    if (count > fds.size() - next_fd) {
      return absl::InternalError("fetch: buffer " + std::to_string(entry.buffer_id()) + " names " +
                                 std::to_string(count) + " fds, the reply carries " +
                                 std::to_string(fds.size() - next_fd) + " more");
    }
    common::FetchedBuffer fetched;
    fetched.buffer_id = entry.buffer_id();
    fetched.size = entry.size();
    fetched.device_type = entry.device_type();
    fetched.handle.data = entry.handle().data();
    for (size_t k = 0; k < count; ++k) fetched.handle.fds.push_back(std::move(fds[next_fd++]));
    out.push_back(std::move(fetched));
  }
  if (next_fd != fds.size()) {
    return absl::InternalError("fetch: the reply carries " + std::to_string(fds.size()) + " fds, its buffers name " +
                               std::to_string(next_fd));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FdConnection::Stage(int memfd) {
  tensord::v1::FdRequest request;
  request.mutable_stage();
  const int fds[1] = {memfd};
  absl::StatusOr<tensord::v1::FdResponse> reply;
  {
    absl::MutexLock lock(&mu_);
    reply = Call(std::move(request), fds, 0, nullptr);
  }
  if (!reply.ok()) return reply.status();
  if (!reply->has_staged()) return absl::InternalError("stage: the broker answered without an id");
  return reply->staged().staged_fd_id();
}

bool FdConnection::PeerClosed() const {
  return common::PeerHungUp(socket_.get());
}

void FdConnection::CloseInForkedChild() {
  broken_.store(true);
  // Only this thread exists in the child; release() then close() so no destructor ever
  // closes the number again (it may be reused by then).
  int fd = socket_.release();
  if (fd >= 0) ::close(fd);
}

}  // namespace tensord::internal
