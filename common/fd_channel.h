// The fd channel's framing: one protobuf message per SOCK_SEQPACKET datagram, file
// descriptors attached with SCM_RIGHTS. Used by the broker's fd server and the client.
//
// Receiving: MSG_CMSG_CLOEXEC always; MSG_TRUNC or MSG_CTRUNC fails the message (every fd
// that did arrive is closed): INVALID_ARGUMENT for an oversized datagram or more fds than
// the caller allows, RESOURCE_EXHAUSTED when fewer than max_fds arrived (our fd table is
// full). A message with more fds than allowed has all its fds closed and is refused. A closed peer
// answers UNAVAILABLE "peer closed the fd channel". EINTR is retried; nothing else loops.
// A non-blocking socket that is not ready is no error: the result says FdIo::kWouldBlock.
// Thread-safety: none of its own; callers serialise use of one socket per direction.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/protocol_limits.h"  // kMaxFdMessageBytes, kMaxFdsPerMessage
#include "common/unique_fd.h"
#include "google/protobuf/message_lite.h"

namespace tensord::common {

// 2: Session-stream batches (SessionRequest.batch, SessionResponse.batch).
// 3: FetchedBuffer carries its device type and a MemoryHandle (bytes and an fd count).
inline constexpr uint32_t kFdProtocolVersion = 3;

// What a send or receive did. kWouldBlock: the socket is non-blocking and was not ready
// (EAGAIN: nothing queued to read, or no room to send); nothing was sent or received, and
// the caller waits for readiness (epoll, poll) before it tries again. A blocking socket
// never answers it.
enum class FdIo { kDone, kWouldBlock };

struct ReceivedMessage {
  FdIo io = FdIo::kDone;  // kWouldBlock: nothing arrived; bytes and fds are empty
  std::string bytes;
  std::vector<UniqueFd> fds;
};

// Serializes `message` and sends it with `fds` attached (the caller keeps its fds).
// INVALID_ARGUMENT when the message exceeds kMaxFdMessageBytes, serializes to zero bytes
// (a zero-length SOCK_SEQPACKET datagram reads as end-of-file at the receiver, so give
// every message a field: FdRequest/FdResponse always have their oneof set), or there are
// too many fds. UNAVAILABLE "peer closed the fd channel" when the peer is gone.
absl::StatusOr<FdIo> SendFdMessage(int socket, const google::protobuf::MessageLite& message,
                                   std::span<const int> fds = {});

// Receives one datagram, blocking unless the socket is non-blocking (then, with nothing
// queued, a message whose io is kWouldBlock).
absl::StatusOr<ReceivedMessage> ReceiveFdMessage(int socket, size_t max_fds);

// Parses `received.bytes` into `message`: INVALID_ARGUMENT "fd channel: malformed <type>";
// FAILED_PRECONDITION for a kWouldBlock result, which holds no message to parse.
absl::Status ParseFdMessage(const ReceivedMessage& received, google::protobuf::MessageLite* message);

struct PeerCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
};
// SO_PEERCRED of a connected Unix socket.
absl::StatusOr<PeerCredentials> GetPeerCredentials(int socket);

// A connected SOCK_SEQPACKET|SOCK_CLOEXEC client socket to `path`. UNAVAILABLE naming the
// path when nothing listens there.
absl::StatusOr<UniqueFd> ConnectSeqpacket(const std::string& path);
// The same for a SOCK_STREAM socket (the gRPC socket).
absl::StatusOr<UniqueFd> ConnectStream(const std::string& path);

// Whether the peer of a connected socket has hung up (or the socket failed), without
// blocking and without reading anything.
bool PeerHungUp(int socket);

}  // namespace tensord::common
