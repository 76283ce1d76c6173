#include "common/socket_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace tensord::common {
namespace {

constexpr std::string_view kSystemSocket = "/run/tensord/tensord.sock";

// An unset and an empty variable mean the same: shells and systemd units often export
// empty values.
std::string_view Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string_view() : std::string_view(value);
}

}  // namespace

std::string PerUserSocketPath() {
  std::string_view runtime_dir = Env("XDG_RUNTIME_DIR");
  while (runtime_dir.size() > 1 && runtime_dir.back() == '/') runtime_dir.remove_suffix(1);
  // The XDG spec says a relative XDG_RUNTIME_DIR is invalid and must be ignored.
  if (!runtime_dir.empty() && runtime_dir.front() == '/') {
    return absl::StrCat(runtime_dir == "/" ? "" : AbslView(runtime_dir), "/tensord/tensord.sock");
  }
  return absl::StrCat("/tmp/tensord-", ::geteuid(), "/tensord.sock");
}

std::string DefaultDaemonSocketPath() {
  if (std::string_view env = Env("TENSORD_SOCKET"); !env.empty()) return std::string(env);
  if (::geteuid() == 0) return std::string(kSystemSocket);
  return PerUserSocketPath();
}

std::string DefaultClientSocketPath() {
  if (std::string_view env = Env("TENSORD_SOCKET"); !env.empty()) return std::string(env);
  // A per-user daemon wins when one has left its socket; otherwise the system one.
  std::string per_user = PerUserSocketPath();
  struct stat st {};
  if (::stat(per_user.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return per_user;
  return std::string(kSystemSocket);
}

namespace {

std::string_view TrimSpaces(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// The uids in `text`, as $TENSORD_TRUSTED_DAEMON_UIDS holds them; `what` names it in errors.
absl::StatusOr<std::vector<uint32_t>> ParseUidList(std::string_view text, std::string_view what) {
  std::vector<uint32_t> uids;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string_view entry =
        TrimSpaces(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    // Decimal digits only, below 2^32 - 1 ((uid_t)-1 means "no uid" to the kernel).
    uint64_t uid = 0;
    bool valid = !entry.empty() && entry.size() <= 10;
    for (char c : entry) {
      valid = valid && c >= '0' && c <= '9';
      if (valid) uid = uid * 10 + static_cast<uint64_t>(c - '0');
    }
    if (!valid || uid >= UINT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": '", std::string(entry),
                                                     "' is not a uid (expected uids as decimal numbers "
                                                     "separated by commas, such as 10001,10002)"));
    }
    uids.push_back(static_cast<uint32_t>(uid));
    if (comma == std::string_view::npos) return uids;
    start = comma + 1;
  }
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> TrustedDaemonUidsFromEnvironment() {
  const std::string_view env = Env(kTrustedDaemonUidsEnv);
  if (TrimSpaces(env).empty()) return std::vector<uint32_t>{};
  return ParseUidList(env, std::string("$") + kTrustedDaemonUidsEnv);
}

namespace {

bool Trusted(uid_t owner, uid_t our_uid, std::span<const uint32_t> trusted_uids) {
  if (owner == 0 || owner == our_uid) return true;
  for (uint32_t uid : trusted_uids) {
    if (uid == owner) return true;
  }
  return false;
}

}  // namespace

absl::Status CheckSocketDirectoryInfo(const std::string& dir, const std::string& socket_path,
                                      const struct stat& info, SocketDirectoryKind kind,
                                      uid_t our_uid, std::span<const uint32_t> trusted_uids) {
  const bool is_dir = S_ISDIR(info.st_mode);
  const mode_t mode = info.st_mode & 07777;
  const uid_t owner = info.st_uid;
  std::string rule;
  std::string remedy;
  if (kind == SocketDirectoryKind::kPerUser) {
    if (is_dir && owner == our_uid && (mode & 077) == 0) return absl::OkStatus();
    rule = absl::StrFormat("the per-user socket directory must be a directory of uid %u with "
                           "mode 0700, not a symlink",
                           our_uid);
    remedy = owner == our_uid
                 ? "remove it (tensord creates it again) or chmod 0700 it"
                 : "someone else may have planted it: have it removed, or set TENSORD_SOCKET "
                   "or XDG_RUNTIME_DIR to use a directory of your own";
  } else {
    const bool root_owned = owner == 0;
    const bool group_ok = (mode & S_IWGRP) == 0 || root_owned;
    const bool other_ok = (mode & S_IWOTH) == 0 || (root_owned && (mode & S_ISVTX) != 0);
    if (is_dir && Trusted(owner, our_uid, trusted_uids) && group_ok && other_ok) {
      return absl::OkStatus();
    }
    rule = absl::StrFormat("a socket directory must belong to root, to uid %u or to a trusted "
                           "daemon uid, and be writable by no one else: by its group only when "
                           "root owns it, by others only when root owns it and it is sticky, "
                           "like /tmp",
                           our_uid);
    remedy = "fix its owner or mode, or use another socket path";
    if (is_dir && !Trusted(owner, our_uid, trusted_uids)) {
      remedy += absl::StrFormat(
          "; if uid %u runs the daemon, trust it (trusted_daemon_uids, $%s)", owner, kTrustedDaemonUidsEnv);
    }
  }
  return absl::PermissionDeniedError(absl::StrFormat(
      "socket directory %s is %s owned by uid %u with mode %04o: refusing to connect to %s (%s); "
      "%s",
      dir, is_dir ? "a directory" : "not a directory", owner, mode, socket_path, rule, remedy));
}

absl::Status CheckSocketDirectory(const std::string& socket_path, uid_t our_uid,
                                  std::span<const uint32_t> trusted_uids) {
  const std::string parent = std::filesystem::path(socket_path).parent_path().string();
  const std::string dir = parent.empty() ? std::string(".") : parent;
  const SocketDirectoryKind kind = socket_path == PerUserSocketPath() ? SocketDirectoryKind::kPerUser
                                                                      : SocketDirectoryKind::kOther;
  struct stat info {};
  // lstat for the per-user directory: a symlink planted where it belongs must not redirect
  // us; a configured path may reach its directory through one (/var/run -> /run).
  const int rc = kind == SocketDirectoryKind::kPerUser ? ::lstat(dir.c_str(), &info)
                                                       : ::stat(dir.c_str(), &info);
  if (rc != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return absl::UnavailableError(absl::StrCat("socket directory ", dir, " does not exist"));
    }
    return ErrnoToStatus(absl::StrCat("stat socket directory ", dir), err);
  }
  return CheckSocketDirectoryInfo(dir, socket_path, info, kind, our_uid, trusted_uids);
}

}  // namespace tensord::common
