#include "server/config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string_view>
#include <tuple>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "toml++/toml.h"

namespace tensord::server {
namespace {

struct Unit {
  const char* suffix;
  double factor;
};

// Longest suffixes first so "MiB" wins over "B".
constexpr Unit kUnits[] = {
    {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
    {"kb", 1e3},     {"mb", 1e6},        {"gb", 1e9},           {"tb", 1e12},
    {"k", 1024.0},   {"m", 1048576.0},   {"g", 1073741824.0},   {"t", 1099511627776.0},
    {"b", 1.0},
};

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

// Caps are counts of things held in memory: 2^32 is far beyond what a node can hold.
constexpr uint64_t kMaxCount = uint64_t{1} << 32;

uint64_t& CountField(Config& config, const std::string& key) {
  if (key == "max_sessions") return config.max_sessions;
  if (key == "max_leases_per_session") return config.max_leases_per_session;
  return config.max_waits_per_session;
}

absl::StatusOr<uint64_t> ParseCount(const std::string& text, const std::string& what) {
  uint64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &value) || value < 1 || value > kMaxCount) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "': expected a whole number from 1 to ", kMaxCount));
  }
  return value;
}

// An arena setting: a size like 16MiB, or 0 (arenas off).
absl::StatusOr<uint64_t> ParseArenaSize(const std::string& text, std::string_view what) {
  if (absl::StripAsciiWhitespace(text) == "0") return 0;
  absl::StatusOr<uint64_t> size = ParseByteSize(text);
  if (!size.ok()) return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": ", size.status().message()));
  return *size;
}

// Arenas are memfds carved in whole pages: sizes round up to a page; a tensor bound above
// the arena size could never fit.
absl::Status FinishArenaSettings(Config& config) {
  constexpr uint64_t kPage = 4096;
  constexpr uint64_t kMaxArena = uint64_t{1} << 40;
  if (config.arena_bytes > kMaxArena) {
    return absl::InvalidArgumentError(absl::StrCat("arena size ", config.arena_bytes, " is above 1 TiB"));
  }
  config.arena_bytes = (config.arena_bytes + kPage - 1) / kPage * kPage;
  config.arena_max_tensor_bytes = (config.arena_max_tensor_bytes + kPage - 1) / kPage * kPage;
  if (config.arena_bytes > 0 && config.arena_max_tensor_bytes > config.arena_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--arena-max-tensor (", config.arena_max_tensor_bytes, " bytes) is larger than --arena-bytes (",
        config.arena_bytes, " bytes): tensors that size could never fit in an arena"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> TomlIdList(const toml::node* node, const std::string& key) {
  std::vector<uint32_t> ids;
  if (node == nullptr) return ids;
  const toml::array* array = node->as_array();
  if (array == nullptr) return absl::InvalidArgumentError(absl::StrCat(key, ": expected a list of ids"));
  for (const toml::node& item : *array) {
    std::optional<int64_t> id = item.value<int64_t>();
    if (!id || *id < 0 || *id > 0xffffffffLL) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": every entry must be a numeric id"));
    }
    ids.push_back(static_cast<uint32_t>(*id));
  }
  return ids;
}

absl::Status ApplyFile(const std::string& path, Config& config) {
  toml::table table;
  try {
    // Debian's toml++ is built with exceptions: a parse error is thrown, caught right here.
    table = toml::parse_file(path);
  } catch (const toml::parse_error& error) {
    return absl::InvalidArgumentError(absl::StrCat("config ", path, ":", error.source().begin.line,
                                                   ": ", std::string(error.description())));
  }
  for (const auto& [key, node] : table) {
    std::string k(key.str());
    if (k == "socket" || k == "socket_group" || k == "log_level") {
      std::optional<std::string> value = node.value<std::string>();
      if (!value) return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", k, " must be a string"));
      if (k == "socket") config.socket = *value;
      if (k == "socket_group") config.socket_group = *value;
      if (k == "log_level") config.log_level = *value;
    } else if (k == "max_host_bytes") {
      if (std::optional<int64_t> bytes = node.value<int64_t>(); bytes && *bytes > 0) {
        config.max_host_bytes = static_cast<uint64_t>(*bytes);
        config.max_host_bytes_source = absl::StrCat("max_host_bytes in ", path);
      } else if (std::optional<std::string> text = node.value<std::string>()) {
        absl::StatusOr<uint64_t> size = ParseByteSize(*text);
        if (!size.ok()) return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", size.status().message()));
        config.max_host_bytes = *size;
        config.max_host_bytes_source = absl::StrCat("max_host_bytes in ", path);
      } else {
        return absl::InvalidArgumentError(absl::StrCat("config ", path, ": max_host_bytes must be a size"));
      }
    } else if (k == "arena_bytes" || k == "arena_max_tensor") {
      // A size, or 0 (arena_bytes only): arenas off.
      uint64_t& target = k == "arena_bytes" ? config.arena_bytes : config.arena_max_tensor_bytes;
      if (std::optional<int64_t> bytes = node.value<int64_t>(); bytes && *bytes >= 0) {
        target = static_cast<uint64_t>(*bytes);
      } else if (std::optional<std::string> text = node.value<std::string>()) {
        absl::StatusOr<uint64_t> size = ParseArenaSize(*text, k);
        if (!size.ok()) return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", size.status().message()));
        target = *size;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", k, " must be a size"));
      }
    } else if (k == "max_sessions" || k == "max_leases_per_session" || k == "max_waits_per_session") {
      std::optional<int64_t> count = node.value<int64_t>();
      if (!count || *count < 1 || static_cast<uint64_t>(*count) > kMaxCount) {
        return absl::InvalidArgumentError(
            absl::StrCat("config ", path, ": ", k, " must be a whole number from 1 to ", kMaxCount));
      }
      CountField(config, k) = static_cast<uint64_t>(*count);
    } else if (k == "acl") {
      const toml::table* acls = node.as_table();
      if (acls == nullptr) return absl::InvalidArgumentError(absl::StrCat("config ", path, ": [acl] must be a table"));
      for (const auto& [ns, entry] : *acls) {
        const toml::table* acl_table = entry.as_table();
        std::string prefix = absl::StrCat("config ", path, ": acl.", std::string(ns.str()));
        if (acl_table == nullptr) return absl::InvalidArgumentError(prefix + " must be a table");
        NamespaceAcl acl;
        for (const auto& [field, value] : *acl_table) {
          std::string f(field.str());
          absl::StatusOr<std::vector<uint32_t>> ids = TomlIdList(&value, prefix + "." + f);
          if (!ids.ok()) return ids.status();
          if (f == "read_uids") acl.read_uids.assign(ids->begin(), ids->end());
          else if (f == "write_uids") acl.write_uids.assign(ids->begin(), ids->end());
          else if (f == "read_gids") acl.read_gids.assign(ids->begin(), ids->end());
          else if (f == "write_gids") acl.write_gids.assign(ids->begin(), ids->end());
          else return absl::InvalidArgumentError(absl::StrCat(prefix, ": unknown key '", f, "'"));
        }
        config.acls[std::string(ns.str())] = std::move(acl);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("config ", path, ": unknown key '", k, "'"));
    }
  }
  config.config_file = path;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  double factor = 1.0;
  absl::string_view number = lower;
  for (const Unit& unit : kUnits) {
    if (absl::ConsumeSuffix(&number, unit.suffix)) {
      factor = unit.factor;
      break;
    }
  }
  number = absl::StripAsciiWhitespace(number);
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value) || !(value > 0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("size '", text, "': expected a positive number of bytes like 512MiB or 4G"));
  }
  double bytes = value * factor;
  if (bytes >= 1.8e19) return absl::InvalidArgumentError(absl::StrCat("size '", text, "' is too large"));
  return static_cast<uint64_t>(bytes);
}

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
    if (why != nullptr) *why = absl::StrCat("half of the cgroup memory limit of ", cgroup.bytes, " bytes in ", cgroup.file);
    return cgroup.bytes / 2;
  }
  if (why != nullptr) {
    *why = absl::StrCat("half of the node's ", total, " bytes of memory (MemTotal); ",
                        cgroup.bytes == 0 ? std::string("no cgroup memory limit")
                                          : absl::StrCat("the cgroup memory limit in ", cgroup.file, " is larger"));
  }
  return total / 2;
}

absl::StatusOr<Config> LoadConfig(int argc, char** argv) {
  CLI::App app{"tensord: share tensors between processes on this node without copying them"};
  std::string config_file, socket, socket_group, max_host, log_level;
  std::string max_sessions, max_leases, max_waits;
  app.add_option("--config", config_file, "TOML file with the same keys (socket, max_host_bytes, ...)");
  app.add_option("--socket", socket, "gRPC socket path (the fd channel is <socket>.fd)");
  app.add_option("--socket-group", socket_group, "group that may connect (sockets are mode 0660)");
  app.add_option("--max-host-bytes", max_host, "host memory quota, e.g. 4G (default: half of available memory)");
  app.add_option("--max-sessions", max_sessions,
                 absl::StrCat("sessions (connected clients) served at once (default ", kDefaultMaxSessions, ")"))
      ->type_name("N");
  app.add_option("--max-leases-per-session", max_leases,
                 absl::StrCat("leases one session may hold (default ", kDefaultMaxLeasesPerSession, ")"))
      ->type_name("N");
  app.add_option("--max-waits-per-session", max_waits,
                 absl::StrCat("acquires and takes one session may have waiting (default ",
                              kDefaultMaxWaitsPerSession, ")"))
      ->type_name("N");
  std::string arena_bytes, arena_max_tensor;
  app.add_option("--arena-bytes", arena_bytes,
                 "size of each arena that small tensors allocated in a namespace share (default 16MiB; 0: off)")
      ->type_name("SIZE");
  app.add_option("--arena-max-tensor", arena_max_tensor,
                 "largest tensor that goes into an arena (default 1MiB)")
      ->type_name("SIZE");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off");
  app.footer(
      "Each flag may also be set as TENSORD_<FLAG> in the environment (TENSORD_MAX_SESSIONS, ...)\n"
      "or as a key in the --config TOML file (max_sessions = 4096, ...); flags win over the\n"
      "environment, which wins over the file. Per-namespace access lists are file-only:\n"
      "  [acl.<namespace>] read_uids = [...] write_uids = [...] read_gids = [...] write_gids = [...]");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return absl::CancelledError("help");
  } catch (const CLI::ParseError& error) {
    return absl::InvalidArgumentError(error.what());
  }

  Config config;
  if (config_file.empty()) {
    if (const char* env = std::getenv("TENSORD_CONFIG"); env != nullptr) config_file = env;
  }
  if (!config_file.empty()) {
    if (absl::Status status = ApplyFile(config_file, config); !status.ok()) return status;
  }
  auto pick = [](const std::string& flag, const char* env_name, std::string& target) {
    if (!flag.empty()) {
      target = flag;
    } else if (const char* env = std::getenv(env_name); env != nullptr && *env != '\0') {
      target = env;
    }
  };
  pick(socket, "TENSORD_SOCKET", config.socket);
  pick(socket_group, "TENSORD_SOCKET_GROUP", config.socket_group);
  pick(log_level, "TENSORD_LOG_LEVEL", config.log_level);
  std::string host_text;
  pick(max_host, "TENSORD_MAX_HOST_BYTES", host_text);
  if (!host_text.empty()) {
    absl::StatusOr<uint64_t> bytes = ParseByteSize(host_text);
    if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("--max-host-bytes: ", bytes.status().message()));
    config.max_host_bytes = *bytes;
    config.max_host_bytes_source = max_host.empty() ? "TENSORD_MAX_HOST_BYTES" : "--max-host-bytes";
  }
  struct CountOption {
    const std::string& flag_value;
    const char* flag;
    const char* env;
    uint64_t& target;
  };
  for (const CountOption& option : {
           CountOption{max_sessions, "--max-sessions", "TENSORD_MAX_SESSIONS", config.max_sessions},
           CountOption{max_leases, "--max-leases-per-session", "TENSORD_MAX_LEASES_PER_SESSION",
                       config.max_leases_per_session},
           CountOption{max_waits, "--max-waits-per-session", "TENSORD_MAX_WAITS_PER_SESSION",
                       config.max_waits_per_session}}) {
    std::string text;
    pick(option.flag_value, option.env, text);
    if (text.empty()) continue;
    absl::StatusOr<uint64_t> count = ParseCount(text, option.flag);
    if (!count.ok()) return count.status();
    option.target = *count;
  }
  for (auto [flag_value, flag, env, target] :
       {std::tuple<const std::string&, const char*, const char*, uint64_t&>{
            arena_bytes, "--arena-bytes", "TENSORD_ARENA_BYTES", config.arena_bytes},
        std::tuple<const std::string&, const char*, const char*, uint64_t&>{
            arena_max_tensor, "--arena-max-tensor", "TENSORD_ARENA_MAX_TENSOR", config.arena_max_tensor_bytes}}) {
    std::string text;
    pick(flag_value, env, text);
    if (text.empty()) continue;
    absl::StatusOr<uint64_t> size = ParseArenaSize(text, flag);
    if (!size.ok()) return size.status();
    target = *size;
  }
  if (absl::Status arenas = FinishArenaSettings(config); !arenas.ok()) return arenas;
  if (config.max_host_bytes == 0) config.max_host_bytes = DefaultMaxHostBytes(&config.max_host_bytes_source);
  return config;
}

}  // namespace tensord::server
