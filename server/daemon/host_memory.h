// How much host memory the daemon may use by default: this process's cgroup memory limit
// (v1 or v2, the tightest of its ancestors) against MemTotal.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tensord::server {

// The tightest cgroup memory limit on this process, and the file that set it.
struct CgroupMemoryLimit {
  uint64_t bytes = 0;  // 0: no limit found
  std::string file;
};

// Reads the limits that bind the process whose /proc/self/cgroup is `proc_self_cgroup`,
// with the cgroup filesystems mounted under `sys_fs_cgroup_root` (/sys/fs/cgroup): v2's
// memory.max ("0::/path", in <root>/<path>, or <root>/unified/<path> on hybrid systems) and
// v1's memory.limit_in_bytes ("N:memory:/path" or a list naming memory, "N:cpu,memory:/path",
// in <root>/memory/<path>, else <root>/cpu,memory/<path>), in the cgroup's directory and in each
// ancestor up to the mount's root: a parent's limit binds its children. The root's own file
// is read even when <path> is not there, as inside a container whose cgroup is mounted as
// the root. "max", v1's "no limit" (2^63 less a page) and unreadable files count as none;
// the smallest limit found wins.
CgroupMemoryLimit FindCgroupMemoryLimit(std::string_view proc_self_cgroup,
                                        const std::string& sys_fs_cgroup_root);

// Half of min(MemTotal, this process's cgroup memory limit). `why`, when given, says which
// of the two it was and where it was read, for the log.
uint64_t DefaultMaxHostBytes(std::string* why = nullptr);

}  // namespace tensord::server
