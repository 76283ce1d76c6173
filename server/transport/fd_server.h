// FdServer: the fd channel at "<socket>.fd" (SOCK_SEQPACKET). One epoll thread accepts
// connections, reads each peer's SO_PEERCRED, answers HELLO with a session, serves FETCH_FD
// (fds sent with SCM_RIGHTS) and STAGE (an fd the client exports), and closes the session
// the instant the connection closes, which is how a killed client's leases are released.
//
// A peer that sends garbage, the wrong protocol version, unexpected fds, or anything before
// HELLO gets an error reply and is disconnected. Replies are sent without blocking: a peer
// that does not read its replies is disconnected rather than allowed to stall the loop.
// Connections beyond the caps (ConnectionLimits: in all, sessions plus those still before
// HELLO, and per uid) are answered RESOURCE_EXHAUSTED and closed at once, and a connection
// that has not said HELLO within `hello_timeout` is answered DEADLINE_EXCEEDED and closed,
// so idle connections cannot hold the slots other clients need.
// Thread-safe: Start/Stop from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/unique_fd.h"
#include "server/access/connection_limits.h"
#include "server/broker/broker.h"
#include "server/transport/unix_socket.h"

namespace tensord::server {

class FdServer {
 public:
  // Asked at HELLO whether the uid's client may open what it needs next (its gRPC
  // connection); an error refuses the session with that status.
  using HelloCheck = std::function<absl::Status(uid_t)>;

  FdServer(Broker* broker, ConnectionCaps caps, std::chrono::milliseconds hello_timeout,
           HelloCheck hello_check = {})
      : broker_(broker), caps_(std::move(caps)), hello_timeout_(hello_timeout),
        hello_check_(std::move(hello_check)) {}
  ~FdServer() { Stop(); }
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  // Serves connections on `socket` (listening: ListenUnix, or passed by systemd). On an
  // error the socket is closed (ListeningSocket::Close), so clients are told at once.
  absl::Status Start(ListeningSocket socket);
  // Stops accepting and closes every connection (closing their sessions).
  void Stop();
  // Stops and starts accepting new connections; sessions go on (a take-over in progress).
  absl::Status PauseAccepting();
  absl::Status ResumeAccepting();
  int listening_fd() const { return socket_.fd.get(); }
  // Stop leaves the socket file in place (it is the new daemon's after a take-over).
  void KeepSocketFile() { socket_.remove_on_close = false; }

 private:
  void Run();

  Broker* const broker_;
  const ConnectionCaps caps_;
  const std::chrono::milliseconds hello_timeout_;
  const HelloCheck hello_check_;
  ListeningSocket socket_;
  common::UniqueFd epoll_fd_;
  common::UniqueFd wake_fd_;  // eventfd: tells the loop to stop
  std::thread thread_;
};

}  // namespace tensord::server
