// Where the daemon listens and where clients look, as DESIGN.md fixes it:
// daemon: $TENSORD_SOCKET, else /run/tensord/tensord.sock as root, else
// $XDG_RUNTIME_DIR/tensord/tensord.sock, else /tmp/tensord-$UID/tensord.sock.
// client: $TENSORD_SOCKET, else the per-user path if a socket exists there, else
// /run/tensord/tensord.sock. The fd channel is "<socket>.fd", the lock "<socket>.lock".
//
// CheckSocketDirectory is the rule a client applies to the directory holding a socket before
// it connects (DefaultClientSocketPath only chooses; the choice is checked like any path).
// It keeps the obvious traps out, with a message that says what to do; the peer checks on
// both sockets (the fd channel's daemon uid, the gRPC socket served by that same daemon) are
// what make a socket someone swapped in harmless.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tensord::common {

std::string DefaultDaemonSocketPath();
std::string DefaultClientSocketPath();

// The uids a client trusts as its daemon besides root and its own when it is given none
// (ClientOptions::trusted_daemon_uids empty): $TENSORD_TRUSTED_DAEMON_UIDS, decimal uids
// separated by commas (spaces around them allowed); none when it is unset or empty. Like
// $TENSORD_SOCKET, it is the client's own environment, so it trusts no one the client's
// user did not choose. INVALID_ARGUMENT naming the variable and the bad entry.
inline constexpr char kTrustedDaemonUidsEnv[] = "TENSORD_TRUSTED_DAEMON_UIDS";
absl::StatusOr<std::vector<uint32_t>> TrustedDaemonUidsFromEnvironment();
// The per-user path ($XDG_RUNTIME_DIR/... or /tmp/tensord-$UID/...), ignoring root.
std::string PerUserSocketPath();
inline std::string FdChannelPath(const std::string& socket) { return socket + ".fd"; }
inline std::string LockPath(const std::string& socket) { return socket + ".lock"; }

// Which rule a socket directory is held to.
enum class SocketDirectoryKind {
  // The directory of PerUserSocketPath(): a real directory (lstat: not a symlink) owned by
  // `our_uid` with no group or other permission bits (mode 0700, as the daemon creates it
  // and insists on when it serves there).
  kPerUser,
  // Any other (a configured path, the system default): a directory (symlinks followed) owned
  // by root, by `our_uid` or by one of `trusted_uids`; writable by its group only when root
  // owns it; writable by others only when root owns it and it is sticky (like /tmp).
  kOther,
};

// Checks the directory holding `socket_path` (its parent; "." for a bare name) against the
// rule for its kind: kPerUser when `socket_path` is PerUserSocketPath(). PERMISSION_DENIED
// naming the directory, its owner and its mode, the rule, and what to do; UNAVAILABLE when
// the directory does not exist (no daemon can be there); another errno code when stat fails.
absl::Status CheckSocketDirectory(const std::string& socket_path, uid_t our_uid,
                                  std::span<const uint32_t> trusted_uids);

// The rule itself on what lstat (kPerUser) or stat (kOther) said about `dir`, which holds
// `socket_path`.
absl::Status CheckSocketDirectoryInfo(const std::string& dir, const std::string& socket_path,
                                      const struct stat& info, SocketDirectoryKind kind,
                                      uid_t our_uid, std::span<const uint32_t> trusted_uids);

}  // namespace tensord::common
