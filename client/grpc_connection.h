// GrpcConnection: one session's gRPC channel, over a Unix socket this client connects itself
// so that it can check who serves it before gRPC writes a byte. Every Broker call carries the
// session token, so the peer must be the daemon that opened the session on the fd channel:
// a uid the client trusts (root, ourselves, trusted_daemon_uids: the fd channel's rule) and
// the same process as the fd channel's peer when both pids are known, else (SO_PEERCRED
// reports pid 0 for a process outside our pid namespace) the same uid. A socket swapped in
// by someone else is refused with PERMISSION_DENIED and never sees the token.
//
// gRPC owns the connected socket once the channel is made (grpc_channel_create_from_fd wraps
// it and closes it with the channel). Such a channel is a direct channel: it never
// reconnects, and gRPC's connectivity-state API does not apply to it (GetState logs an error
// and answers SHUTDOWN). So the connection keeps a duplicate of the socket, close-on-exec like
// the original and never read or written, and Closed() polls it: it turns true when the
// broker closed the connection or gRPC shut it down (gRPC's closing a transport shuts its
// socket down), and the owner then makes a new GrpcConnection for its next call.
//
// Lifetime: shared by the Session and every call made on it; the channel stays up until the
// last of them lets go. Thread-safe: constant after Connect().
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "grpcpp/channel.h"
#include "tensord/v1/broker.grpc.pb.h"

namespace tensord::internal {

// OK when `peer` (SO_PEERCRED of the gRPC socket at `socket_path`) is the daemon `daemon`
// (SO_PEERCRED of its fd channel), as the header comment says; else PERMISSION_DENIED naming
// both sockets, uids and pids.
absl::Status CheckGrpcPeer(const common::PeerCredentials& peer,
                           const common::PeerCredentials& daemon, uid_t our_uid,
                           std::span<const uint32_t> trusted_uids, const std::string& socket_path);

class GrpcConnection {
 public:
  // Connects to the gRPC socket at `socket_path`, checks its peer against `daemon`, and makes
  // the channel. UNAVAILABLE when nothing listens there; PERMISSION_DENIED for a refused peer.
  static absl::StatusOr<std::shared_ptr<GrpcConnection>> Connect(
      const std::string& socket_path, const common::PeerCredentials& daemon,
      std::span<const uint32_t> trusted_uids);
  GrpcConnection(const GrpcConnection&) = delete;
  GrpcConnection& operator=(const GrpcConnection&) = delete;

  tensord::v1::Broker::Stub* stub() const { return stub_.get(); }
  // Whether the connection is gone for good (see the header comment). One poll(2).
  bool Closed() const;
  // Shuts the socket down as a broker closing the connection would.
  void ShutdownForTest();

 private:
  GrpcConnection() = default;

  // Destroyed in reverse order: the stub, then the channel, then the duplicate.
  common::UniqueFd watch_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tensord::v1::Broker::Stub> stub_;
};

}  // namespace tensord::internal
