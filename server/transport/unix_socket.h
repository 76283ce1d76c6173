// Listening Unix sockets for the daemon's two endpoints (gRPC and the fd channel).
//
// ListenUnix binds, sets the mode and group, and only then listens, so no client can
// connect while the socket still has the umask's mode. AcceptShedding accepts one
// connection; when the fd table is full (EMFILE/ENFILE) it sheds the oldest pending
// connection with a spare descriptor kept for that purpose, so a level-triggered poll on
// the listening socket does not spin. Not thread-safe: one owner per socket.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace tensord::server {

// A listening socket and its file. A socket the daemon bound itself is removed when it stops
// listening; one the service manager passed (socket activation) is the manager's and stays,
// so the next start of the service finds it.
struct ListeningSocket {
  common::UniqueFd fd;
  std::string path;
  bool remove_on_close = true;

  // Closes the fd, then removes the file if it is ours.
  void Close();
};

// `type` is SOCK_STREAM or SOCK_SEQPACKET. An old file at `path` is removed first: the
// caller holds the lock that proves no other daemon serves it. group -1: unchanged.
absl::StatusOr<ListeningSocket> ListenUnix(const std::string& path, int type, mode_t mode, gid_t group);

// An int SOL_SOCKET option of `fd` (SO_TYPE, SO_DOMAIN, SO_ACCEPTCONN); -1 when it cannot
// be read.
int SocketOption(int fd, int option);

// A listening socket this process was given (by systemd, or by a daemon it takes over
// from): checked to be a listening AF_UNIX socket of `type` bound to a path, and made
// non-blocking and close-on-exec, as ListenUnix's are. FAILED_PRECONDITION naming `what`.
absl::StatusOr<ListeningSocket> AdoptListening(common::UniqueFd fd, int type, const std::string& what,
                                               bool remove_on_close);

class Acceptor {
 public:
  Acceptor();
  // A new non-blocking, close-on-exec connection; an invalid fd when none is pending (or
  // when one was shed because the fd table is full: then *shed is set).
  common::UniqueFd Accept(int listen_fd, bool* shed);

 private:
  common::UniqueFd spare_;  // /dev/null, given up to accept-and-close when out of fds
};

}  // namespace tensord::server
