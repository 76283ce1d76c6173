// Daemon configuration: built-in defaults < TOML file (--config) < TENSORD_* environment
// variables < command-line flags. The same keys everywhere: socket, socket_group,
// max_host_bytes, max_sessions, max_leases_per_session, max_waits_per_session, the per-uid
// limits and max_grpc_connections below, arena_bytes, arena_max_tensor, the recycling caps,
// max_device_bytes, metrics_address, log_level,
// [acl.<namespace>] tables (config only). LoadConfig resolves every default, so a Config it
// returns holds the final numbers. How values are written and checked: config_values.h.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/access/access_policy.h"
#include "server/access/connection_limits.h"
#include "server/access/uid_quota.h"
#include "server/daemon/config_values.h"
#include "server/daemon/host_memory.h"
#include "server/memory/arena.h"
#include "server/memory/buffer_pool.h"
#include "server/memory/memory_quota.h"
#include "server/state/session_manager.h"

namespace tensord::server {

struct Config {
  std::string socket;        // empty: the default path for our uid
  std::string socket_group;  // group of the sockets (mode 0660); empty: our primary group
  uint64_t max_host_bytes = 0;  // 0: half of the memory the daemon may use
  std::string max_host_bytes_source;  // where max_host_bytes came from, for the log
  // Caps that keep one client from exhausting the daemon; exceeding one answers
  // RESOURCE_EXHAUSTED naming it. Sessions are fd-channel connections after HELLO.
  uint64_t max_sessions = kDefaultMaxSessions;
  uint64_t max_leases_per_session = kDefaultMaxLeasesPerSession;
  uint64_t max_waits_per_session = kDefaultMaxWaitsPerSession;
  // Per-uid caps, so that one uid cannot starve the others. They do not bind root or the
  // daemon's own uid.
  uint64_t max_sessions_per_uid = kDefaultMaxSessionsPerUid;
  // fd-channel connections (before and after HELLO) and gRPC connections of one uid.
  uint64_t max_connections_per_uid = kDefaultMaxConnectionsPerUid;
  uint64_t max_tensors_per_uid = kDefaultMaxTensorsPerUid;
  uint64_t max_waits_per_uid = kDefaultMaxWaitsPerUid;
  uint64_t max_watchers_per_uid = kDefaultMaxWatchersPerUid;
  // Names, descriptions, tags and waits that one uid's tensors and requests keep in the daemon.
  uint64_t max_metadata_bytes_per_uid = kDefaultMaxMetadataBytesPerUid;
  // Host memory one uid holds in buffers outside namespaces that have an ACL; 0 before
  // LoadConfig resolves it: a quarter of max_host_bytes. Never above max_host_bytes.
  uint64_t max_host_bytes_per_uid = 0;
  // gRPC connections of all uids together.
  uint64_t max_grpc_connections = kDefaultMaxGrpcConnections;
  // Arenas: tensors of at most arena_max_tensor_bytes allocated in a namespace share
  // arena_bytes memfds (0 turns arenas off). Both are page multiples.
  uint64_t arena_bytes = kDefaultArenaBytes;
  uint64_t arena_max_tensor_bytes = kDefaultArenaMaxTensorBytes;
  // Recycled buffers: dedicated host buffers a producer session's next tensors in the same
  // namespace reuse (server/memory/buffer_pool.h). recycle_bytes_per_session 0 turns it off.
  uint64_t recycle_buffers_per_session = kDefaultRecycleBuffersPerSession;
  uint64_t recycle_bytes_per_session = kDefaultRecycleBytesPerSession;
  std::string max_device_bytes;  // as written; LoadConfig parses it into device_limits
  DeviceLimits device_limits;
  // Prometheus text endpoint: "HOST:PORT" or "unix:PATH" (metrics_endpoint.h); empty: off.
  std::string metrics_address;
  // "on": keep the named tensors in systemd's fd store (fd_store.h); "off" (the default).
  std::string fd_store = "off";
  // The cluster (server/cluster/): off while cluster_etcd is empty. Lists are comma-separated.
  std::string cluster_etcd;
  std::string node_name;  // empty: the host name
  std::string cluster_listen;
  std::string cluster_namespaces;
  std::string cluster_ca_file;
  std::string cluster_cert_file;
  std::string cluster_key_file;
  std::string cluster_peer_name;  // empty: peers' certificates are checked against their address
  std::string cluster_insecure = "off";
  std::string log_level = "info";
  std::map<std::string, NamespaceAcl> acls;  // namespace -> ACL
  std::string config_file;   // where the file values came from, for the log
  // --take-over: an action for this start, not a setting (no key, no variable).
  bool take_over = false;
  // Key -> where its value came from ("--max-sessions", "environment TENSORD_...",
  // "config FILE:LINE: key"); a key not here has its default.
  std::map<std::string, std::string> origins;
};

// The effective configuration as a TOML file the daemon reads back (--config): every key
// with its value and a comment saying where the value came from (a flag, the environment,
// the file and line, or the default and what it is), then the ACLs. Unset text keys
// (socket_group, max_device_bytes) are comments saying what holds without them.
std::string PrintedConfig(const Config& config);

// Parses argv, the environment and the config file. `--help`, `--version` and
// `--print-config` are answered by printing usage, "tensord <version>" or PrintedConfig to
// stdout and returning CANCELLED (the caller exits 0).
absl::StatusOr<Config> LoadConfig(int argc, char** argv);

}  // namespace tensord::server
