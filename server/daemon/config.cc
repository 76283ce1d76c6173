#include "server/daemon/config.h"
#include "server/transport/metrics_endpoint.h"

#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/numeric/int128.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/human_bytes.h"
#include "common/names.h"
#include "common/socket_paths.h"
#include "common/status.h"
#include "server/memory/arena.h"
#include "tensord_build_info.h"  // generated: cmake/TensordBuildInfo.cmake
#include "toml++/toml.h"

#ifndef TENSORD_VERSION
#define TENSORD_VERSION "0.0.0"
#endif

namespace tensord::server {
namespace {

struct Unit {
  const char* name;  // lower case; units are matched without regard to case
  uint64_t factor;
};

constexpr Unit kUnits[] = {
    {"b", 1},
    {"k", uint64_t{1} << 10},  {"kib", uint64_t{1} << 10}, {"kb", 1000},
    {"m", uint64_t{1} << 20},  {"mib", uint64_t{1} << 20}, {"mb", 1000 * 1000},
    {"g", uint64_t{1} << 30},  {"gib", uint64_t{1} << 30}, {"gb", 1000 * 1000 * 1000},
    {"t", uint64_t{1} << 40},  {"tib", uint64_t{1} << 40}, {"tb", uint64_t{1000} * 1000 * 1000 * 1000},
};

constexpr char kSizeForm[] =
    "a size is a decimal number of bytes with an optional unit (B, K, KiB, KB, M, MiB, MB, G, GiB, GB, T, "
    "TiB, TB), like 512MiB, 4G or 1.5GiB";

// Caps are counts of things held in memory: 2^32 is far beyond what a node can hold.
constexpr uint64_t kMaxCount = uint64_t{1} << 32;

absl::Status Invalid(absl::string_view reason) { return absl::InvalidArgumentError(reason); }

bool IsDigits(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), absl::ascii_isdigit);
}

absl::string_view TakeDigits(absl::string_view& text) {
  size_t n = 0;
  while (n < text.size() && absl::ascii_isdigit(text[n])) ++n;
  absl::string_view digits = text.substr(0, n);
  text.remove_prefix(n);
  return digits;
}

// The mistakes that used to be guessed at, each refused with its own reason: a sign,
// hexadecimal, leading zeros (octal to some readers), scientific notation, inner whitespace.
absl::Status RefuseCommonMistakes(absl::string_view text, absl::string_view form) {
  if (text.empty()) return Invalid(absl::StrCat("empty; ", form));
  if (text[0] == '+' || text[0] == '-') return Invalid(absl::StrCat("no sign is accepted; ", form));
  if (absl::StartsWithIgnoreCase(text, "0x")) return Invalid(absl::StrCat("hexadecimal is not accepted; ", form));
  absl::string_view rest = text;
  absl::string_view whole = TakeDigits(rest);
  if (whole.size() > 1 && whole[0] == '0') {
    return Invalid(absl::StrCat("leading zeros are not accepted (octal is not either); ", form));
  }
  if (absl::ConsumePrefix(&rest, ".")) TakeDigits(rest);
  if (!whole.empty() && rest.size() > 1 && (rest[0] == 'e' || rest[0] == 'E') &&
      (absl::ascii_isdigit(rest[1]) || rest[1] == '+' || rest[1] == '-')) {
    return Invalid(absl::StrCat("scientific notation is not accepted; ", form));
  }
  if (std::any_of(text.begin(), text.end(), absl::ascii_isspace)) {
    return Invalid(absl::StrCat("no whitespace is accepted inside; ", form));
  }
  return absl::OkStatus();
}

// The grammar of sizes: digits, optionally '.' and digits, optionally a unit; the result a
// whole number of bytes from 1 to 2^63-1. Errors give the reason only; callers say where
// the text came from.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (absl::Status mistake = RefuseCommonMistakes(text, kSizeForm); !mistake.ok()) return mistake;
  absl::string_view rest = text;
  absl::string_view whole = TakeDigits(rest);
  absl::string_view fraction;
  bool has_point = absl::ConsumePrefix(&rest, ".");
  if (has_point) fraction = TakeDigits(rest);
  if (whole.empty() || (has_point && fraction.empty())) return Invalid(kSizeForm);
  uint64_t factor = 1;
  if (!rest.empty()) {
    std::string unit = absl::AsciiStrToLower(rest);
    const Unit* found = std::find_if(std::begin(kUnits), std::end(kUnits),
                                     [&](const Unit& u) { return unit == u.name; });
    if (found == std::end(kUnits)) return Invalid(absl::StrCat("unknown unit '", rest, "'; ", kSizeForm));
    factor = found->factor;
  } else if (has_point) {
    return Invalid("a fraction needs a unit, like 1.5GiB: a number alone is a whole number of bytes");
  }
  // Buffers are sized in off_t: a size above its largest value could never be allocated, and
  // a quota that large (9999999TiB) is a typo, not a limit.
  constexpr char kTooLarge[] = "too large: a size is at most 9223372036854775807 bytes (8 EiB, the largest off_t)";
  if (whole.size() > 20) return Invalid(kTooLarge);
  absl::uint128 bytes = 0;
  for (char digit : whole) bytes = bytes * 10 + static_cast<uint64_t>(digit - '0');
  bytes *= factor;
  // Exact arithmetic: 1.5GiB is 1610612736 bytes, and 0.1B is refused rather than rounded.
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (!fraction.empty()) {
    // 10^26 times a TiB still fits 128 bits; no whole number of bytes needs more places.
    if (fraction.size() > 26) return Invalid("more than 26 decimal places: not a whole number of bytes");
    absl::uint128 numerator = 0, denominator = 1;
    for (char digit : fraction) {
      numerator = numerator * 10 + static_cast<uint64_t>(digit - '0');
      denominator *= 10;
    }
    numerator *= factor;
    if (numerator % denominator != 0) return Invalid("not a whole number of bytes");
    bytes += numerator / denominator;
  }
  if (bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Invalid(kTooLarge);
  if (bytes == 0) return Invalid("0 bytes: a size is at least 1 byte");
  return absl::Uint128Low64(bytes);
}

absl::StatusOr<DeviceLimits> ParseDeviceLimitsText(std::string_view text) {
  DeviceLimits limits;
  bool have_all = false;
  for (absl::string_view entry : absl::StrSplit(common::AbslView(text), ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) return Invalid("an empty entry: write SIZE or DEVICE=SIZE between commas");
    const size_t eq = entry.find('=');
    absl::string_view name = eq == absl::string_view::npos ? absl::string_view() : absl::StripAsciiWhitespace(entry.substr(0, eq));
    absl::string_view value = eq == absl::string_view::npos ? entry : entry.substr(eq + 1);
    absl::StatusOr<uint64_t> bytes = ParseSize(value);
    if (!bytes.ok()) return Invalid(absl::StrCat(common::QuoteForError(std::string(entry)), ": ", bytes.status().message()));
    if (eq == absl::string_view::npos) {
      if (have_all) return Invalid("two values for every device: name the device of the second (DEVICE=SIZE)");
      have_all = true;
      limits.all = *bytes;
      continue;
    }
    const bool uuid = absl::StartsWith(name, "GPU-") && name.size() > 4;
    const size_t colon = name.find(':');
    const bool ordinal = colon != absl::string_view::npos && colon > 0 && colon + 1 < name.size() &&
                         std::all_of(name.begin() + static_cast<std::ptrdiff_t>(colon) + 1, name.end(),
                                     [](char c) { return absl::ascii_isdigit(c); });
    if (!uuid && !ordinal) {
      return Invalid(absl::StrCat(common::QuoteForError(std::string(entry)), ": name the device by its UUID (GPU-...) or as "
                                  "backend:ordinal (cuda:0), as tensorctl status shows it"));
    }
    if (!limits.by_device.emplace(std::string(name), *bytes).second) {
      return Invalid(absl::StrCat(common::QuoteForError(std::string(name)), " is given twice"));
    }
  }
  return limits;
}

absl::StatusOr<uint64_t> ParseCount(absl::string_view text) {
  static const std::string form = absl::StrCat("a count is a whole decimal number from 1 to ", kMaxCount);
  text = absl::StripAsciiWhitespace(text);
  if (absl::Status mistake = RefuseCommonMistakes(text, form); !mistake.ok()) return mistake;
  if (absl::StrContains(text, '.')) return Invalid(absl::StrCat("a count has no fraction; ", form));
  if (!IsDigits(text)) return Invalid(form);
  uint64_t count = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), count);
  if (error == std::errc::result_out_of_range || count > kMaxCount) return Invalid(absl::StrCat("too large; ", form));
  if (count == 0) return Invalid(absl::StrCat("too small; ", form));
  return count;
}

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

constexpr char kHelpFooter[] =
    "Each flag may also be set as TENSORD_<FLAG> in the environment (TENSORD_MAX_SESSIONS, ...)\n"
    "or as a key in the --config TOML file (max_sessions = 4096, ...); flags win over the\n"
    "environment, which wins over the file. Per-namespace access lists are file-only:\n"
    "  [acl.<namespace>] read_uids = [...] write_uids = [...] read_gids = [...] write_gids = [...]\n"
    "The per-uid limits (--max-*-per-uid) do not bind root or the daemon's own uid.\n"
    "Sizes: a whole number of bytes, or a decimal number with a unit: 512MiB, 4G, 1.5GiB (K, M, G, T\n"
    "and KiB...TiB are binary; KB, MB, GB, TB decimal). Counts (N): a whole number from 1 to 2^32.\n"
    "No signs, hexadecimal, leading zeros or exponents; in the file a count is a TOML integer and\n"
    "a size a TOML integer or string.";

// How a setting is written and checked. Every setting has a TOML key, a flag (the key with
// '-' for '_') and an environment variable (TENSORD_ and the key in upper case).
enum class Kind {
  kText,
  kSize,         // ParseSize, or a TOML integer >= 1
  kSizeOrZero,   // the same, or 0 (arenas: off)
  kCount,        // ParseCount, or a TOML integer from 1 to kMaxCount; never a TOML string
};

struct Setting {
  std::string key;
  Kind kind;
  std::string Config::*text = nullptr;  // kText
  uint64_t Config::*number = nullptr;   // every other kind
  std::string type_name;
  std::string help;

  std::string Flag() const {
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    return flag;
  }
  std::string Env() const { return "TENSORD_" + absl::AsciiStrToUpper(key); }
};

// In the order --help lists them.
const std::vector<Setting>& Settings() {
  static const std::vector<Setting> settings = {
      {"socket", Kind::kText, &Config::socket, nullptr, "PATH",
       "gRPC socket path, the fd channel is <socket>.fd (default: /run/tensord/tensord.sock as root, else "
       "$XDG_RUNTIME_DIR/tensord/tensord.sock or /tmp/tensord-<uid>/tensord.sock)"},
      {"socket_group", Kind::kText, &Config::socket_group, nullptr, "GROUP",
       "group that may connect (sockets are mode 0660): a name or a numeric gid"},
      {"max_host_bytes", Kind::kSize, nullptr, &Config::max_host_bytes, "SIZE",
       "host memory quota, e.g. 4G (default: half of the node's memory or of the cgroup memory limit, if smaller)"},
      {"max_sessions", Kind::kCount, nullptr, &Config::max_sessions, "N",
       absl::StrCat("sessions (connected clients) served at once (default ", kDefaultMaxSessions, ")")},
      {"max_leases_per_session", Kind::kCount, nullptr, &Config::max_leases_per_session, "N",
       absl::StrCat("leases one session may hold (default ", kDefaultMaxLeasesPerSession, ")")},
      {"max_waits_per_session", Kind::kCount, nullptr, &Config::max_waits_per_session, "N",
       absl::StrCat("acquires and takes one session may have waiting (default ", kDefaultMaxWaitsPerSession, ")")},
      {"max_sessions_per_uid", Kind::kCount, nullptr, &Config::max_sessions_per_uid, "N",
       absl::StrCat("sessions one uid may have at once (default ", kDefaultMaxSessionsPerUid, ")")},
      {"max_connections_per_uid", Kind::kCount, nullptr, &Config::max_connections_per_uid, "N",
       absl::StrCat("connections one uid may have open: fd-channel ones, before and after HELLO, and gRPC ones "
                    "(default ", kDefaultMaxConnectionsPerUid, ")")},
      {"max_grpc_connections", Kind::kCount, nullptr, &Config::max_grpc_connections, "N",
       absl::StrCat("gRPC connections served at once, all uids together (default ", kDefaultMaxGrpcConnections, ")")},
      {"max_tensors_per_uid", Kind::kCount, nullptr, &Config::max_tensors_per_uid, "N",
       absl::StrCat("tensors one uid may hold in the daemon (default ", kDefaultMaxTensorsPerUid, ")")},
      {"max_waits_per_uid", Kind::kCount, nullptr, &Config::max_waits_per_uid, "N",
       absl::StrCat("acquires and takes one uid may have waiting, all its sessions together (default ",
                    kDefaultMaxWaitsPerUid, ")")},
      {"max_watchers_per_uid", Kind::kCount, nullptr, &Config::max_watchers_per_uid, "N",
       absl::StrCat("watches one uid may have open (default ", kDefaultMaxWatchersPerUid, ")")},
      {"max_metadata_bytes_per_uid", Kind::kSize, nullptr, &Config::max_metadata_bytes_per_uid, "SIZE",
       "bytes of names, descriptions, tags and waits one uid's tensors and requests may keep in the daemon "
       "(default 256MiB)"},
      {"max_host_bytes_per_uid", Kind::kSize, nullptr, &Config::max_host_bytes_per_uid, "SIZE",
       "host memory one uid may hold in buffers outside namespaces that have an ACL (default: a quarter of "
       "--max-host-bytes, which it may not exceed)"},
      {"arena_bytes", Kind::kSizeOrZero, nullptr, &Config::arena_bytes, "SIZE",
       "size of each arena that small tensors allocated in a namespace share (default 16MiB; 0: off)"},
      {"arena_max_tensor", Kind::kSizeOrZero, nullptr, &Config::arena_max_tensor_bytes, "SIZE",
       "largest tensor that goes into an arena (default 1MiB)"},
      {"recycle_buffers_per_session", Kind::kCount, nullptr, &Config::recycle_buffers_per_session, "N",
       absl::StrCat("dedicated buffers whose tensors are gone that one producer session keeps for its next "
                    "tensors in the same namespace (default ", kDefaultRecycleBuffersPerSession, ")")},
      {"recycle_bytes_per_session", Kind::kSizeOrZero, nullptr, &Config::recycle_bytes_per_session, "SIZE",
       "bytes of such recycled buffers one producer session keeps; they count in --max-host-bytes and are "
       "taken back before an allocation would fail (default 1GiB; 0: recycling off)"},
      {"max_device_bytes", Kind::kText, &Config::max_device_bytes, nullptr, "LIMITS",
       "GPU memory quota: one SIZE for every device, or DEVICE=SIZE entries separated by commas, a device named "
       "by its UUID (GPU-...) or as cuda:N, e.g. 8GiB,GPU-3f1c...=20GiB (default: each device's own memory)"},
      {"metrics_address", Kind::kText, &Config::metrics_address, nullptr, "ADDRESS",
       "serve Prometheus metrics at http://ADDRESS/metrics: HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464) or "
       "unix:PATH (default: off)"},
      {"fd_store", Kind::kText, &Config::fd_store, nullptr, "on|off",
       "under systemd, keep the named tensors in its file-descriptor store, so a restart or a crash keeps them "
       "(the unit needs FileDescriptorStoreMax=; default off)"},
      {"log_level", Kind::kText, &Config::log_level, nullptr, "LEVEL",
       "trace, debug, info, warn, error, critical or off"},
  };
  return settings;
}

const Setting* FindSetting(absl::string_view key) {
  for (const Setting& setting : Settings()) {
    if (setting.key == key) return &setting;
  }
  return nullptr;
}

// A text value from a flag or the environment; `where` names it for the error.
absl::Status ApplyText(const Setting& setting, const std::string& text, const std::string& where, Config& config) {
  if (setting.kind == Kind::kText) {
    config.*setting.text = text;
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> number;
  if (setting.kind == Kind::kCount) {
    number = ParseCount(text);
  } else if (setting.kind == Kind::kSizeOrZero && absl::StripAsciiWhitespace(text) == "0") {
    number = 0;
  } else {
    number = ParseSize(text);
  }
  if (!number.ok()) {
    return Invalid(absl::StrCat(where, " ", common::QuoteForError(text), ": ", number.status().message()));
  }
  config.*setting.number = *number;
  return absl::OkStatus();
}

std::string TomlTypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "nothing";
  }
}

// A TOML value as an error message shows it: strings quoted, arrays and tables by type.
std::string DescribeToml(const toml::node& node) {
  if (const toml::value<std::string>* text = node.as_string()) return common::QuoteForError(text->get());
  if (const toml::value<int64_t>* integer = node.as_integer()) return absl::StrCat(integer->get());
  if (const toml::value<bool>* boolean = node.as_boolean()) return boolean->get() ? "true" : "false";
  if (const toml::value<double>* number = node.as_floating_point()) {
    std::ostringstream out;
    out << *number;  // as TOML writes it: 1.0, 1e-300
    return out.str();
  }
  return absl::StrCat("(", TomlTypeName(node), ")");
}

// A value from the file. The TOML type must fit the setting: a string for text, an integer
// for a count, an integer (bytes) or a string (with units) for a size; never a boolean, a
// float, an array or a table, which used to be converted silently.
absl::Status ApplyToml(const Setting& setting, const toml::node& node, const std::string& where, Config& config) {
  auto refuse = [&](absl::string_view reason) {
    return Invalid(absl::StrCat(where, " ", DescribeToml(node), ": ", reason));
  };
  if (setting.kind == Kind::kText) {
    if (!node.is_string()) return refuse(absl::StrCat("must be a TOML string, not ", TomlTypeName(node)));
    config.*setting.text = node.as_string()->get();
    return absl::OkStatus();
  }
  if (const toml::value<int64_t>* integer = node.as_integer()) {
    int64_t value = integer->get();
    if (setting.kind == Kind::kCount && (value < 1 || static_cast<uint64_t>(value) > kMaxCount)) {
      return refuse(absl::StrCat("a count is a whole number from 1 to ", kMaxCount));
    }
    if (value < (setting.kind == Kind::kSizeOrZero ? 0 : 1)) {
      return refuse(setting.kind == Kind::kSizeOrZero ? "a size is 0 (off) or at least 1 byte"
                                                      : "a size is at least 1 byte");
    }
    config.*setting.number = static_cast<uint64_t>(value);
    return absl::OkStatus();
  }
  if (setting.kind == Kind::kCount) {
    return refuse(absl::StrCat("a count must be a TOML integer, like 4096, not ", TomlTypeName(node)));
  }
  if (!node.is_string()) {
    return refuse(absl::StrCat("a size must be a TOML integer (bytes) or a string like \"4GiB\", not ",
                               TomlTypeName(node)));
  }
  return ApplyText(setting, node.as_string()->get(), where, config);
}

// Arenas are memfds carved in whole pages (the arena's own, ArenaAlignment()): sizes round up
// to a page; a tensor bound above the arena size could never fit.
absl::Status FinishArenaSettings(Config& config) {
  const uint64_t page = ArenaAlignment();
  constexpr uint64_t kMaxArena = uint64_t{1} << 40;
  if (config.arena_bytes > kMaxArena) {
    return absl::InvalidArgumentError(absl::StrCat("arena size ", config.arena_bytes, " is above 1 TiB"));
  }
  config.arena_bytes = (config.arena_bytes + page - 1) / page * page;
  config.arena_max_tensor_bytes = (config.arena_max_tensor_bytes + page - 1) / page * page;
  if (config.arena_bytes > 0 && config.arena_max_tensor_bytes > config.arena_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--arena-max-tensor (", config.arena_max_tensor_bytes, " bytes) is larger than --arena-bytes (",
        config.arena_bytes, " bytes): tensors that size could never fit in an arena"));
  }
  return absl::OkStatus();
}

// Where a value from the file came from, for errors: "config /etc/tensord.toml:3: max_sessions".
std::string FileWhere(const std::string& path, const toml::node& node, absl::string_view key) {
  return absl::StrCat("config ", path, ":", node.source().begin.line, ": ", key);
}

// Resolves max_host_bytes's default and, from it, max_host_bytes_per_uid's; `origins` says
// where the given ones came from.
absl::Status FinishHostBytes(const std::map<std::string, std::string>& origins, Config& config) {
  if (auto origin = origins.find("max_host_bytes"); origin != origins.end()) {
    config.max_host_bytes_source = origin->second;
  } else {
    config.max_host_bytes = DefaultMaxHostBytes(&config.max_host_bytes_source);
  }
  auto per_uid = origins.find("max_host_bytes_per_uid");
  if (per_uid == origins.end()) {
    config.max_host_bytes_per_uid = std::max<uint64_t>(1, config.max_host_bytes / 4);
  } else if (config.max_host_bytes_per_uid > config.max_host_bytes) {
    return Invalid(absl::StrCat(per_uid->second, " (", config.max_host_bytes_per_uid,
                                " bytes) is larger than the host memory quota of all uids, max_host_bytes (",
                                config.max_host_bytes, " bytes, ", config.max_host_bytes_source, ")"));
  }
  return absl::OkStatus();
}

absl::Status FinishDeviceLimits(const std::map<std::string, std::string>& origins, Config& config) {
  if (config.max_device_bytes.empty()) return absl::OkStatus();
  auto origin = origins.find("max_device_bytes");
  const std::string where = origin != origins.end() ? origin->second : "max_device_bytes";
  absl::StatusOr<DeviceLimits> limits = ParseDeviceLimitsText(config.max_device_bytes);
  if (!limits.ok()) {
    return Invalid(absl::StrCat(where, " ", common::QuoteForError(config.max_device_bytes), ": ",
                                limits.status().message()));
  }
  config.device_limits = *std::move(limits);
  config.device_limits.source = where;
  return absl::OkStatus();
}

absl::Status CheckFdStore(const Config& config, const std::map<std::string, std::string>& origins) {
  if (config.fd_store == "on" || config.fd_store == "off") return absl::OkStatus();
  auto origin = origins.find("fd_store");
  return Invalid(absl::StrCat(origin != origins.end() ? origin->second : "fd_store", " ",
                              common::QuoteForError(config.fd_store), ": must be on or off"));
}

absl::Status CheckMetricsAddress(const Config& config, const std::map<std::string, std::string>& origins) {
  if (config.metrics_address.empty()) return absl::OkStatus();
  absl::StatusOr<MetricsAddress> address = ParseMetricsAddress(config.metrics_address);
  if (address.ok()) return absl::OkStatus();
  auto origin = origins.find("metrics_address");
  return Invalid(absl::StrCat(origin != origins.end() ? origin->second : "metrics_address", " ",
                              common::QuoteForError(config.metrics_address), ": ", address.status().message()));
}

// Checked when the configuration loads, where it is known where the group came from; the
// daemon looks it up again when it creates the sockets.
absl::Status CheckSocketGroup(const Config& config, const std::map<std::string, std::string>& origins) {
  if (config.socket_group.empty()) return absl::OkStatus();
  absl::StatusOr<gid_t> gid = LookUpGroup(config.socket_group);
  if (gid.ok()) return absl::OkStatus();
  auto origin = origins.find("socket_group");
  return absl::Status(gid.status().code(), absl::StrCat(origin != origins.end() ? origin->second : "socket_group", " ",
                                                        common::QuoteForError(config.socket_group), ": ",
                                                        gid.status().message()));
}

// [acl."bad/ns"] as the file would have to write it, for errors.
std::string AclTableName(const std::string& ns) {
  bool bare = !ns.empty() && std::all_of(ns.begin(), ns.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '_' || c == '-';
  });
  if (bare) return absl::StrCat("[acl.", ns, "]");
  constexpr size_t kShown = 128;
  return absl::StrCat("[acl.\"", absl::CHexEscape(absl::string_view(ns).substr(0, kShown)),
                      ns.size() > kShown ? "..." : "", "\"]");
}

// A list of uids or gids: TOML integers from 0 to 2^32-2 (the kernel reads (uid_t)-1 as "no
// id"). Names are not looked up.
absl::StatusOr<std::vector<uint32_t>> TomlIdList(const toml::node& node, const std::string& where,
                                                 absl::string_view kind) {
  const toml::array* array = node.as_array();
  if (array == nullptr) {
    return Invalid(absl::StrCat(where, " ", DescribeToml(node), ": must be a list of numeric ", kind,
                                "s, like [1000, 1001], not ", TomlTypeName(node)));
  }
  constexpr int64_t kMaxId = 0xfffffffe;
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::node& item = *array->get(i);
    const toml::value<int64_t>* id = item.as_integer();
    if (id == nullptr || id->get() < 0 || id->get() > kMaxId) {
      return Invalid(absl::StrCat(where, "[", i, "] ", DescribeToml(item), ": a ", kind,
                                  " is an integer from 0 to ", kMaxId,
                                  id == nullptr ? absl::StrCat(", not ", TomlTypeName(item)) : ""));
    }
    ids.push_back(static_cast<uint32_t>(id->get()));
  }
  return ids;
}

// The [acl.<namespace>] tables. A namespace that ValidateNamespace refuses could never
// match a tensor's name: its table is an error, not a rule that silently grants nothing.
absl::Status ApplyAcls(const std::string& path, const toml::node& node, Config& config) {
  const toml::table* acls = node.as_table();
  if (acls == nullptr) {
    return Invalid(absl::StrCat(FileWhere(path, node, "acl"), " ", DescribeToml(node),
                                ": must be [acl.<namespace>] tables, not ", TomlTypeName(node)));
  }
  for (const auto& [ns_key, entry] : *acls) {
    std::string ns(ns_key.str());
    std::string table = AclTableName(ns);
    std::string where = absl::StrCat("config ", path, ":", entry.source().begin.line, ": ", table);
    if (absl::Status valid = common::ValidateNamespace(ns); !valid.ok()) {
      return Invalid(absl::StrCat(where, ": could never match a tensor: ", valid.message()));
    }
    const toml::table* fields = entry.as_table();
    if (fields == nullptr) return Invalid(absl::StrCat(where, ": must be a table, not ", TomlTypeName(entry)));
    NamespaceAcl acl;
    for (const auto& [field_key, value] : *fields) {
      std::string field(field_key.str());
      std::string field_where = absl::StrCat("config ", path, ":", value.source().begin.line, ": ", table, " ", field);
      bool uids = field == "read_uids" || field == "write_uids";
      if (!uids && field != "read_gids" && field != "write_gids") {
        return Invalid(absl::StrCat(field_where,
                                    ": unknown key; an ACL has read_uids, write_uids, read_gids and write_gids"));
      }
      TENSORD_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, TomlIdList(value, field_where, uids ? "uid" : "gid"));
      if (field == "read_uids") acl.read_uids.assign(ids.begin(), ids.end());
      if (field == "write_uids") acl.write_uids.assign(ids.begin(), ids.end());
      if (field == "read_gids") acl.read_gids.assign(ids.begin(), ids.end());
      if (field == "write_gids") acl.write_gids.assign(ids.begin(), ids.end());
    }
    config.acls[ns] = std::move(acl);
  }
  return absl::OkStatus();
}

absl::Status ApplyFile(const std::string& path, Config& config, std::map<std::string, std::string>& origins) {
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
    if (const Setting* setting = FindSetting(k)) {
      TENSORD_RETURN_IF_ERROR(ApplyToml(*setting, node, FileWhere(path, node, k), config));
      origins[k] = FileWhere(path, node, k);
    } else if (k == "acl") {
      TENSORD_RETURN_IF_ERROR(ApplyAcls(path, node, config));
    } else {
      // A misspelt key would otherwise do nothing, silently.
      std::vector<std::string> known;
      for (const Setting& setting : Settings()) known.push_back(setting.key);
      known.push_back("[acl.<namespace>]");
      return Invalid(absl::StrCat(FileWhere(path, node, k), ": unknown key; the keys are ", absl::StrJoin(known, ", ")));
    }
  }
  config.config_file = path;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  absl::StatusOr<uint64_t> size = ParseSize(text);
  if (!size.ok()) return Invalid(absl::StrCat("size ", common::QuoteForError(text), ": ", size.status().message()));
  return size;
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

absl::StatusOr<gid_t> LookUpGroup(std::string_view group_text) {
  absl::string_view text(group_text.data(), group_text.size());
  std::optional<gid_t> number;
  if (IsDigits(text)) {
    constexpr uint64_t kMaxGid = std::numeric_limits<gid_t>::max() - 1;
    if (text.size() > 1 && text[0] == '0') return Invalid("leading zeros are not accepted in a numeric gid");
    uint64_t value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || value > kMaxGid) return Invalid(absl::StrCat("a gid is at most ", kMaxGid));
    number = static_cast<gid_t>(value);
  }
  std::string name(text);
  long hint = sysconf(_SC_GETGR_R_SIZE_MAX);
  std::vector<char> buffer(hint > 0 ? static_cast<size_t>(hint) : 4096);
  group entry{};
  group* found = nullptr;
  int error = 0;
  // A group with many members needs a larger buffer; 1 MiB is plenty, and bounds the retries.
  constexpr size_t kMaxBuffer = size_t{1} << 20;
  while (true) {
    error = number ? getgrgid_r(*number, &entry, buffer.data(), buffer.size(), &found)
                   : getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
    if (error != ERANGE || buffer.size() >= kMaxBuffer) break;
    buffer.resize(buffer.size() * 2);
  }
  // getgr*_r(3): these say "not found" on some systems.
  if (error != 0 && error != ENOENT && error != ESRCH && error != EBADF && error != EPERM) {
    return common::ErrnoToStatus("look up the group", error);
  }
  if (found == nullptr) {
    return Invalid(number ? absl::StrCat("no group has gid ", *number) : std::string("no such group"));
  }
  return found->gr_gid;
}

absl::StatusOr<Config> LoadConfig(int argc, char** argv) {
  CLI::App app{"tensord: share tensors between processes on this node without copying them"};
  app.get_formatter()->column_width(40);
  std::string config_file;
  app.add_option("--config", config_file, "TOML file with the same keys (socket, max_host_bytes, ...)")
      ->type_name("FILE");
  const std::vector<Setting>& settings = Settings();
  std::vector<std::string> flag_values(settings.size());
  std::vector<CLI::Option*> flags(settings.size());
  for (size_t i = 0; i < settings.size(); ++i) {
    std::string help = settings[i].help;
    // The one default that depends on who runs the daemon (and on TENSORD_SOCKET).
    if (settings[i].key == "socket") {
      help += absl::StrCat("; for uid ", ::geteuid(), ": ", common::DefaultDaemonSocketPath());
    }
    flags[i] = app.add_option(settings[i].Flag(), flag_values[i], help)->type_name(settings[i].type_name);
  }
  bool take_over = false;
  app.add_flag("--take-over", take_over,
               "take the sockets and named tensors of the tensord serving the same socket, then serve them "
               "(it exits once this one serves; docs/deployment.md)");
  bool print_config = false;
  app.add_flag("--print-config", print_config,
               "print the effective configuration (each value and where it came from) as TOML, and exit");
  app.set_version_flag("--version", "tensord " TENSORD_VERSION_LINE,
                       "print the version, the commit built and the memory backends, and exit");
  app.footer(kHelpFooter);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return absl::CancelledError("help");
  } catch (const CLI::CallForVersion& version) {
    std::cout << version.what() << "\n";
    return absl::CancelledError("version");
  } catch (const CLI::ParseError& error) {
    return absl::InvalidArgumentError(error.what());
  }

  Config config;
  config.take_over = take_over;
  // key -> where its value came from, as errors and the log name it.
  std::map<std::string, std::string> origins;
  if (config_file.empty()) {
    if (const char* env = std::getenv("TENSORD_CONFIG"); env != nullptr) config_file = env;
  }
  if (!config_file.empty()) TENSORD_RETURN_IF_ERROR(ApplyFile(config_file, config, origins));
  for (size_t i = 0; i < settings.size(); ++i) {
    const Setting& setting = settings[i];
    // An empty flag is a value (refused for numbers); an empty variable is taken as unset.
    if (flags[i]->count() > 0) {
      TENSORD_RETURN_IF_ERROR(ApplyText(setting, flag_values[i], setting.Flag(), config));
      origins[setting.key] = setting.Flag();
    } else if (const char* env = std::getenv(setting.Env().c_str()); env != nullptr && *env != '\0') {
      std::string where = absl::StrCat("environment ", setting.Env(), " (", setting.Flag(), ")");
      TENSORD_RETURN_IF_ERROR(ApplyText(setting, env, where, config));
      origins[setting.key] = where;
    }
  }
  TENSORD_RETURN_IF_ERROR(FinishArenaSettings(config));
  TENSORD_RETURN_IF_ERROR(CheckSocketGroup(config, origins));
  TENSORD_RETURN_IF_ERROR(FinishHostBytes(origins, config));
  TENSORD_RETURN_IF_ERROR(FinishDeviceLimits(origins, config));
  TENSORD_RETURN_IF_ERROR(CheckMetricsAddress(config, origins));
  TENSORD_RETURN_IF_ERROR(CheckFdStore(config, origins));
  config.origins = std::move(origins);
  if (print_config) {
    std::cout << PrintedConfig(config);
    return absl::CancelledError("print-config");
  }
  return config;
}

namespace {

std::string TomlString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

template <typename Id>
std::string TomlIds(const std::vector<Id>& ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ", "), "]");
}

// What a key's value is when nothing sets it: the text after "default".
std::string DefaultNote(const std::string& key, const Config& config) {
  if (key == "socket") return absl::StrCat("default for uid ", ::geteuid());
  if (key == "max_host_bytes") return absl::StrCat("default: ", config.max_host_bytes_source);
  if (key == "max_host_bytes_per_uid") return "default: a quarter of max_host_bytes";
  return "default";
}

}  // namespace

std::string PrintedConfig(const Config& config) {
  std::string out = absl::StrCat("# tensord ", TENSORD_VERSION,
                                 ": the effective configuration, each value with where it came from.\n"
                                 "# The daemon reads this file back with --config.\n");
  for (const Setting& setting : Settings()) {
    auto origin = config.origins.find(setting.key);
    std::string where = origin != config.origins.end() ? origin->second : DefaultNote(setting.key, config);
    if (setting.kind == Kind::kText) {
      std::string value = config.*setting.text;
      if (setting.key == "socket" && value.empty()) value = common::DefaultDaemonSocketPath();
      if (value.empty()) {
        out += absl::StrCat("# ", setting.key, " is unset: ", setting.help, "\n");
        continue;
      }
      out += absl::StrCat(setting.key, " = ", TomlString(value), "  # ", where, "\n");
    } else {
      out += absl::StrCat(setting.key, " = ", config.*setting.number, "  # ", where, "\n");
    }
  }
  for (const auto& [ns, acl] : config.acls) {
    out += absl::StrCat("\n[acl.", TomlString(ns), "]  # ", config.config_file, "\nread_uids = ", TomlIds(acl.read_uids),
                        "\nwrite_uids = ", TomlIds(acl.write_uids), "\nread_gids = ", TomlIds(acl.read_gids),
                        "\nwrite_gids = ", TomlIds(acl.write_gids), "\n");
  }
  return out;
}

absl::StatusOr<DeviceLimits> ParseDeviceLimits(std::string_view text) { return ParseDeviceLimitsText(text); }

}  // namespace tensord::server
