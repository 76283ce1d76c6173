// FdServer: the fd channel at "<socket>.fd" (SOCK_SEQPACKET). One epoll thread accepts
// connections, reads each peer's SO_PEERCRED, answers HELLO with a session, serves FETCH_FD
// (fds sent with SCM_RIGHTS) and STAGE (an fd the client exports), and closes the session
// the instant the connection closes, which is how a killed client's leases are released.
//
// A peer that sends garbage, the wrong protocol version, unexpected fds, or anything before
// HELLO gets an error reply and is disconnected. Replies are sent without blocking: a peer
// that does not read its replies is disconnected rather than allowed to stall the loop.
// Connections beyond `max_connections` (sessions plus those still before HELLO) are
// answered RESOURCE_EXHAUSTED and closed at once.
// Thread-safe: Start/Stop from one thread.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/unique_fd.h"
#include "server/broker.h"

namespace tensord::server {

class FdServer {
 public:
  FdServer(Broker* broker, uint64_t max_connections)
      : broker_(broker), max_connections_(max_connections) {}
  ~FdServer() { Stop(); }
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  // Binds and listens at `path` (an old socket file there is removed first: the caller
  // holds the lock that proves no other daemon serves it) with `mode`, then starts the loop.
  absl::Status Start(const std::string& path, mode_t mode, gid_t group);
  // Stops accepting and closes every connection (closing their sessions).
  void Stop();

 private:
  void Run();

  Broker* const broker_;
  const uint64_t max_connections_;
  common::UniqueFd listen_fd_;
  common::UniqueFd epoll_fd_;
  common::UniqueFd wake_fd_;  // eventfd: tells the loop to stop
  std::thread thread_;
  std::string path_;
};

}  // namespace tensord::server
