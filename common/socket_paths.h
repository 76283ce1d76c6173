// Where the daemon listens and where clients look, as DESIGN.md fixes it:
// daemon: $TENSORD_SOCKET, else /run/tensord/tensord.sock as root, else
// $XDG_RUNTIME_DIR/tensord/tensord.sock, else /tmp/tensord-$UID/tensord.sock.
// client: $TENSORD_SOCKET, else the per-user path if a socket exists there, else
// /run/tensord/tensord.sock. The fd channel is "<socket>.fd", the lock "<socket>.lock".
#pragma once

#include <string>

namespace tensord::common {

std::string DefaultDaemonSocketPath();
std::string DefaultClientSocketPath();
// The per-user path ($XDG_RUNTIME_DIR/... or /tmp/tensord-$UID/...), ignoring root.
std::string PerUserSocketPath();
inline std::string FdChannelPath(const std::string& socket) { return socket + ".fd"; }
inline std::string LockPath(const std::string& socket) { return socket + ".lock"; }

}  // namespace tensord::common
