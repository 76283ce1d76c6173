// ConnectionLimits: how many connections one socket accepts, in all and per uid, so one
// local user cannot take every connection slot or every file descriptor of the daemon.
//
// Admit counts a connection of `uid` or refuses it; Leave gives its slot back. The per-uid
// cap binds every uid but the exempt ones (root and the daemon's own uid); the total binds
// everyone. Errors: RESOURCE_EXHAUSTED naming the socket, the count and the flag.
// Not thread-safe: one owner (the socket's accept loop).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace tensord::server {

// Defaults of --max-connections-per-uid and --max-grpc-connections.
inline constexpr uint64_t kDefaultMaxConnectionsPerUid = 1024;
inline constexpr uint64_t kDefaultMaxGrpcConnections = 8192;

struct ConnectionCaps {
  uint64_t total = 0;        // 0: no cap
  std::string total_flag;    // what sets it, for messages
  uint64_t per_uid = 0;      // 0: no cap
  std::vector<uid_t> exempt_uids;
};

class ConnectionLimits {
 public:
  ConnectionLimits(std::string socket_name, ConnectionCaps caps)
      : socket_name_(std::move(socket_name)), caps_(std::move(caps)) {}

  absl::Status Admit(uid_t uid);
  // What Admit would answer now, counting nothing.
  absl::Status CheckRoom(uid_t uid) const;
  void Leave(uid_t uid);

  uint64_t total() const { return total_; }
  uint64_t of_uid(uid_t uid) const;
  bool Exempt(uid_t uid) const;

 private:
  const std::string socket_name_;
  const ConnectionCaps caps_;
  uint64_t total_ = 0;
  absl::flat_hash_map<uid_t, uint64_t> per_uid_;
};

}  // namespace tensord::server
