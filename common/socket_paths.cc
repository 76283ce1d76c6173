#include "common/socket_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
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

}  // namespace tensord::common
