#include "server/daemon/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/human_bytes.h"

namespace tensord::server {
namespace {

// cgroup v1 says "no limit" with 2^63 rounded down to a page (9223372036854771712 with 4 KiB
// pages); no real limit comes near this.
constexpr uint64_t kCgroupNoLimit = uint64_t{1} << 62;

// The limit in one memory.max or memory.limit_in_bytes; 0 when the file is missing, says
// "max", or holds anything but a number of bytes.
uint64_t ReadCgroupLimitFile(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  if (!std::getline(file, line)) return 0;
  absl::string_view text = absl::StripAsciiWhitespace(line);
  uint64_t bytes = 0;
  if (text.empty() || !std::all_of(text.begin(), text.end(), absl::ascii_isdigit)) return 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), bytes);
  if (error != std::errc() || end != text.data() + text.size() || bytes >= kCgroupNoLimit) return 0;
  return bytes;
}

// Reads `file_name` in <mount><path> and in each of its ancestors up to <mount> itself,
// keeping the smallest limit in `best`. The directories need not exist: in a container the
// process's path may not be there and the mount's root is its own cgroup.
void ReadCgroupLimitsUpTo(const std::string& mount, absl::string_view path, const char* file_name,
                          CgroupMemoryLimit& best) {
  std::string dir(absl::StripSuffix(path, "/"));
  // A path the kernel would never write is not followed outside the mount.
  if (!absl::StartsWith(dir, "/") || absl::StrContains(absl::StrCat(dir, "/"), "/../")) dir.clear();
  while (true) {
    std::string file = absl::StrCat(mount, dir, "/", file_name);
    uint64_t bytes = ReadCgroupLimitFile(file);
    if (bytes != 0 && (best.bytes == 0 || bytes < best.bytes)) best = {bytes, file};
    if (dir.empty()) return;
    dir.resize(dir.rfind('/'));
  }
}

}  // namespace

CgroupMemoryLimit FindCgroupMemoryLimit(std::string_view proc_self_cgroup,
                                        const std::string& sys_fs_cgroup_root) {
  CgroupMemoryLimit best;
  absl::string_view text(proc_self_cgroup.data(), proc_self_cgroup.size());
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    // "hierarchy-id:controller,list:/path"; the path may itself hold ':'.
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    absl::string_view path = absl::StripTrailingAsciiWhitespace(fields[2]);
    if (fields[0] == "0" && fields[1].empty()) {
      // Hybrid systems mount v2 at unified/; the memory controller is then v1's.
      for (const char* mount : {"", "/unified"}) {
        ReadCgroupLimitsUpTo(sys_fs_cgroup_root + mount, path, "memory.max", best);
      }
      continue;
    }
    std::vector<absl::string_view> controllers = absl::StrSplit(fields[1], ',');
    if (std::find(controllers.begin(), controllers.end(), "memory") == controllers.end()) continue;
    // The memory hierarchy is mounted at memory/, or at its controller list ("cpu,memory")
    // with memory/ a symlink to it.
    for (std::string mount : {absl::StrCat(sys_fs_cgroup_root, "/memory"),
                              absl::StrCat(sys_fs_cgroup_root, "/", fields[1])}) {
      std::error_code error;
      if (std::filesystem::is_directory(mount, error)) {
        ReadCgroupLimitsUpTo(mount, path, "memory.limit_in_bytes", best);
        break;
      }
    }
  }
  return best;
}

uint64_t DefaultMaxHostBytes(std::string* why) {
  uint64_t total = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  std::ifstream file("/proc/self/cgroup");
  std::stringstream proc_self_cgroup;
  proc_self_cgroup << file.rdbuf();
  CgroupMemoryLimit cgroup = FindCgroupMemoryLimit(proc_self_cgroup.str(), "/sys/fs/cgroup");
  if (cgroup.bytes != 0 && cgroup.bytes < total) {
    if (why != nullptr) *why = absl::StrCat("half of the cgroup memory limit of ", common::HumanBytes(cgroup.bytes), " in ", cgroup.file);
    return cgroup.bytes / 2;
  }
  if (why != nullptr) {
    *why = absl::StrCat("half of MemTotal, ", common::HumanBytes(total), "; ",
                        cgroup.bytes == 0 ? std::string("no cgroup memory limit")
                                          : absl::StrCat("the cgroup memory limit in ", cgroup.file, " is larger"));
  }
  return total / 2;
}

}  // namespace tensord::server
