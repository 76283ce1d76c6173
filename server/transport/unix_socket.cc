#include "server/transport/unix_socket.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

void ListeningSocket::Close() {
  fd.reset();
  if (remove_on_close && !path.empty()) unlink(path.c_str());
  path.clear();
}

absl::StatusOr<ListeningSocket> ListenUnix(const std::string& path, int type, mode_t mode, gid_t group) {
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is ", path.size(),
                                                   " bytes: must be 1 to ",
                                                   sizeof(address.sun_path) - 1));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  common::UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return common::ErrnoToStatus(absl::StrCat("socket for ", path), errno);
  unlink(path.c_str());
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return common::ErrnoToStatus(absl::StrCat("bind ", path), errno);
  }
  // Connections are refused until listen(): set the mode and group first.
  if (chmod(path.c_str(), mode) != 0) return common::ErrnoToStatus(absl::StrCat("chmod ", path), errno);
  if (group != static_cast<gid_t>(-1) && chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    return common::ErrnoToStatus(absl::StrCat("chown ", path, " to group ", group), errno);
  }
  if (listen(fd.get(), 512) != 0) return common::ErrnoToStatus(absl::StrCat("listen on ", path), errno);
  return ListeningSocket{std::move(fd), path, true};
}

int SocketOption(int fd, int option) {
  int value = -1;
  socklen_t size = sizeof(value);
  return getsockopt(fd, SOL_SOCKET, option, &value, &size) == 0 ? value : -1;
}

absl::StatusOr<ListeningSocket> AdoptListening(common::UniqueFd fd, int type, const std::string& what,
                                               bool remove_on_close) {
  if (SocketOption(fd.get(), SO_DOMAIN) != AF_UNIX) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is not a Unix socket"));
  }
  if (SocketOption(fd.get(), SO_TYPE) != type) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is of the wrong type"));
  }
  if (SocketOption(fd.get(), SO_ACCEPTCONN) != 1) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is not listening"));
  }
  sockaddr_un address{};
  socklen_t size = sizeof(address);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    return common::ErrnoToStatus(absl::StrCat("getsockname of ", what), errno);
  }
  const size_t path_bytes = size > offsetof(sockaddr_un, sun_path) ? size - offsetof(sockaddr_un, sun_path) : 0;
  if (path_bytes == 0 || address.sun_path[0] == '\0') {
    // Clients find the daemon by a path; an abstract or unbound socket has none.
    return absl::FailedPreconditionError(absl::StrCat(what, " is not bound to a path"));
  }
  std::string path(address.sun_path, strnlen(address.sun_path, path_bytes));
  int flags = fcntl(fd.get(), F_GETFL);
  if (flags < 0 || fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) != 0 || fcntl(fd.get(), F_SETFD, FD_CLOEXEC) != 0) {
    return common::ErrnoToStatus(absl::StrCat("set ", what, " non-blocking and close-on-exec"), errno);
  }
  return ListeningSocket{std::move(fd), std::move(path), remove_on_close};
}

Acceptor::Acceptor() : spare_(open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

common::UniqueFd Acceptor::Accept(int listen_fd, bool* shed) {
  *shed = false;
  if (!spare_) spare_.reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
  while (true) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) return common::UniqueFd(fd);
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if ((errno == EMFILE || errno == ENFILE) && spare_) {
      // The connection stays pending and keeps the socket readable: take it with the spare
      // descriptor and close it, so the client sees the daemon refuse rather than hang.
      spare_.reset();
      common::UniqueFd refused(accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
      spare_.reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
      *shed = refused.valid();
      if (*shed) spdlog::warn("out of file descriptors: a new connection was refused");
      return common::UniqueFd();
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      spdlog::warn("accept: {}", std::strerror(errno));
    }
    return common::UniqueFd();
  }
}

}  // namespace tensord::server
