// Take-over: a new daemon (tensord --take-over) receives a running daemon's listening
// sockets and its named tensors with their memory, starts serving, and the old daemon ends
// its sessions and exits 0. Envoy's hot restart is the model.
//
// The running daemon listens on <socket>.takeover (SOCK_SEQPACKET, mode 0600) and hands
// over only to its own uid or root (SO_PEERCRED). One TakeOverMessage per datagram:
//   new -> old  request (protocol version)
//   old -> new  state, with the snapshot memfd, the gRPC socket and the fd-channel socket
//   old -> new  buffer_fds, with up to kFdsPerMessage memory fds each, as many as needed
//   old -> new  end
//   new -> old  serving, once it serves; if it closes instead, the old daemon goes on
// Every receive waits at most kStepTimeout. Sessions, leases and hand-over tokens are not
// carried; clients reconnect (the library does on its next call) and acquire again.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "server/transport/unix_socket.h"
#include "tensord/v1/registry_snapshot.pb.h"

namespace tensord::server {

inline constexpr uint32_t kTakeOverProtocolVersion = 1;
inline constexpr std::chrono::seconds kTakeOverStepTimeout{30};

// "<socket>.takeover".
std::string TakeOverPath(const std::string& socket);

// What the new daemon receives.
struct TakenOver {
  common::UniqueFd connection;  // to the old daemon: Serving() goes here
  tensord::v1::TakeOverState state;
  tensord::v1::RegistrySnapshot snapshot;  // read and checked (registry_snapshot.h)
  ListeningSocket grpc, fd_channel;        // listening, non-blocking; their files are ours now
  std::vector<common::UniqueFd> buffer_fds;

  // Tells the old daemon that this one serves.
  absl::Status Serving();
};

// Connects to the daemon serving `socket` and takes its state. UNAVAILABLE when no daemon
// serves a take-over socket there; FAILED_PRECONDITION with the old daemon's reason when it
// refuses; the snapshot's own errors when it cannot be read.
absl::StatusOr<TakenOver> TakeOverFrom(const std::string& socket);

// The old daemon's side of one hand-over, on an accepted connection.
class HandOverSession {
 public:
  explicit HandOverSession(common::UniqueFd connection) : connection_(std::move(connection)) {}
  // Reads the request: PERMISSION_DENIED for a peer that is neither our uid nor root,
  // FAILED_PRECONDITION for another protocol version (the peer is told why).
  absl::Status ReadRequest();
  // Sends the state and every buffer fd; the caller keeps its fds.
  absl::Status Send(const tensord::v1::TakeOverState& state, int snapshot_fd, int grpc_fd, int fd_channel_fd,
                    const std::vector<common::UniqueFd>& buffer_fds);
  // OK once the new daemon says it serves.
  absl::Status AwaitServing();
  void Refuse(const std::string& why);

 private:
  common::UniqueFd connection_;
};

// The old daemon's take-over socket: one thread accepts and runs `handler` for each
// connection, one at a time.
class TakeOverListener {
 public:
  using Handler = std::function<void(common::UniqueFd)>;
  TakeOverListener() = default;
  ~TakeOverListener() { Stop(); }
  TakeOverListener(const TakeOverListener&) = delete;
  TakeOverListener& operator=(const TakeOverListener&) = delete;

  absl::Status Start(const std::string& socket, Handler handler);
  // Stops accepting; removes the file unless KeepFile() was called (after a hand-over the
  // file is the new daemon's).
  void Stop();
  void KeepFile() { socket_.remove_on_close = false; }

 private:
  ListeningSocket socket_;
  common::UniqueFd wake_fd_;
  Handler handler_;
  std::thread thread_;
};

}  // namespace tensord::server
