// GrpcListener: the gRPC socket. tensord accepts gRPC connections itself, reads each one's
// SO_PEERCRED, and hands it to the gRPC server (AddInsecureChannelFromFd), so every call's
// credentials are known and a session token is honoured only from the uid and gid that
// opened its session: a token another user has seen is useless to them.
//
// gRPC names such a connection "fd:<N>" in its calls' peer string. So that a number never
// names two connections while a call of the first may still be on its way to a handler,
// accepted sockets are moved to numbers that rotate through a large range (thousands of
// connections go by before one is reused).
//
// Connections count against caps in all and per uid (ConnectionLimits), so one user's idle
// connections cannot take every file descriptor of the daemon. gRPC closes a connection it
// owns without telling us, so a connection is known gone when its fd number no longer holds
// the socket it was (its inode); the counts are swept that way when a cap is reached. A
// connection over a cap is sent an HTTP/2 GOAWAY (ENHANCE_YOUR_CALM) whose debug text names
// the cap, and closed. A gRPC client reads that only if it has not written yet (it then
// sees the write fail), so the fd channel asks CheckRoomFor before it opens a session: a
// client of the library is refused at HELLO with RESOURCE_EXHAUSTED naming the cap.
//
// Thread-safety: Start and Stop from one thread; Lookup from any.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "grpcpp/server.h"
#include "server/access/connection_limits.h"
#include "server/transport/broker_service.h"
#include "server/transport/unix_socket.h"

namespace tensord::server {

class GrpcListener final : public PeerDirectory {
 public:
  GrpcListener() = default;
  ~GrpcListener() override { Stop(); }
  GrpcListener(const GrpcListener&) = delete;
  GrpcListener& operator=(const GrpcListener&) = delete;

  // Accepts on `socket` (listening: ListenUnix, or passed by systemd) and feeds connections
  // to `server`, which must be started and outlive Stop().
  absl::Status Start(ListeningSocket socket, grpc::Server* server, ConnectionCaps caps);
  // Stops accepting and closes the socket (ListeningSocket::Close); connections already
  // handed over stay.
  void Stop();
  // Stops accepting and hands the socket back open, its file in place: a take-over passes
  // it on, or Start takes it again when the take-over fails.
  ListeningSocket Release();

  std::optional<common::PeerCredentials> Lookup(std::string_view peer) const override;
  // RESOURCE_EXHAUSTED when a new connection of `uid` would be over a cap now.
  absl::Status CheckRoomFor(uid_t uid);

 private:
  struct Peer {
    common::PeerCredentials creds;
    ino_t inode = 0;  // of the socket, to tell when gRPC has closed it
  };

  void Run();
  // Admits a connection of `uid` under the caps, sweeping closed connections first when a
  // cap is reached (at most every 100 ms).
  absl::Status Admit(uid_t uid);
  // Forgets connections whose fd no longer holds their socket.
  void SweepClosedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Track(int fd, const common::PeerCredentials& creds, ino_t inode);
  // Moves `fd` to the next free number of the rotating range; the fd itself when the
  // range is full or too small for the open-file limit.
  int MoveToRotatingNumber(int fd);

  grpc::Server* server_ = nullptr;
  ListeningSocket socket_;
  common::UniqueFd wake_fd_;
  std::thread thread_;
  // Only the accept thread touches these after Start.
  int rotate_first_ = 0, rotate_end_ = 0, rotate_next_ = 0;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Peer> peers_ ABSL_GUARDED_BY(mu_);
  std::optional<ConnectionLimits> limits_ ABSL_GUARDED_BY(mu_);  // set by Start
  std::chrono::steady_clock::time_point last_sweep_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace tensord::server
