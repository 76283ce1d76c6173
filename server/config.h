// Daemon configuration: built-in defaults < TOML file (--config) < TENSORD_* environment
// variables < command-line flags. The same keys everywhere: socket, socket_group,
// max_host_bytes, max_sessions, max_leases_per_session, max_waits_per_session, log_level,
// [acl.<namespace>] tables (config only).
//
// Sizes accept plain bytes or units: 512MiB, 4G, 1.5GiB (K/M/G/T are binary, like the
// rest of Linux memory tooling; "KB"/"MB"/"GB" are decimal).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tensord::server {

inline constexpr uint64_t kDefaultMaxSessions = 4096;
inline constexpr uint64_t kDefaultMaxLeasesPerSession = uint64_t{1} << 20;
inline constexpr uint64_t kDefaultMaxWaitsPerSession = 1024;
// Small tensors allocated in a namespace are carved out of arenas of this size.
inline constexpr uint64_t kDefaultArenaBytes = uint64_t{16} << 20;
inline constexpr uint64_t kDefaultArenaMaxTensorBytes = uint64_t{1} << 20;

// Who may read and write one namespace. Empty lists grant nothing; the daemon's own uid and
// root always have access.
struct NamespaceAcl {
  std::vector<uid_t> read_uids, write_uids;
  std::vector<gid_t> read_gids, write_gids;
};

struct Config {
  std::string socket;        // empty: the default path for our uid
  std::string socket_group;  // group of the sockets (mode 0660); empty: our primary group
  uint64_t max_host_bytes = 0;  // 0: half of the memory the daemon may use
  // Caps that keep one client from exhausting the daemon; exceeding one answers
  // RESOURCE_EXHAUSTED naming it. Sessions are fd-channel connections after HELLO.
  uint64_t max_sessions = kDefaultMaxSessions;
  uint64_t max_leases_per_session = kDefaultMaxLeasesPerSession;
  uint64_t max_waits_per_session = kDefaultMaxWaitsPerSession;
  // Arenas: tensors of at most arena_max_tensor_bytes allocated in a namespace share
  // arena_bytes memfds (0 turns arenas off). Both are page multiples.
  uint64_t arena_bytes = kDefaultArenaBytes;
  uint64_t arena_max_tensor_bytes = kDefaultArenaMaxTensorBytes;
  std::string log_level = "info";
  std::map<std::string, NamespaceAcl> acls;  // namespace -> ACL
  std::string config_file;   // where the file values came from, for the log
};

// Parses argv, the environment and the config file. `--help` is answered by printing
// usage to stdout and returning CANCELLED (the caller exits 0).
absl::StatusOr<Config> LoadConfig(int argc, char** argv);

// "512MiB" -> 536870912. INVALID_ARGUMENT naming the text on anything else.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

// Half of min(MemTotal, the cgroup v2/v1 memory limit of this process).
uint64_t DefaultMaxHostBytes();

}  // namespace tensord::server
