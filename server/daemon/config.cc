#include "server/daemon/config.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/names.h"
#include "common/socket_paths.h"
#include "common/status.h"
#include "server/memory/arena.h"
#include "server/transport/metrics_endpoint.h"
#include "tensord_build_info.h"  // generated: cmake/TensordBuildInfo.cmake
#include "toml++/toml.h"

#ifndef TENSORD_VERSION
#define TENSORD_VERSION "0.0.0"
#endif

namespace tensord::server {
namespace {

absl::Status Invalid(absl::string_view reason) { return absl::InvalidArgumentError(reason); }


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
      {"cluster_etcd", Kind::kText, &Config::cluster_etcd, nullptr, "URL[,URL...]",
       "join a cluster of tensord nodes whose directory is on etcd at these v3 endpoints, http:// or https:// "
       "(default: off; the node shares nothing)"},
      {"node_name", Kind::kText, &Config::node_name, nullptr, "NAME",
       "this node's name in the cluster (default: the host name)"},
      {"cluster_listen", Kind::kText, &Config::cluster_listen, nullptr, "HOST:PORT",
       "where this daemon serves the other nodes' brokers; the address they reach it at"},
      {"cluster_namespaces", Kind::kText, &Config::cluster_namespaces, nullptr, "NS[,NS...]",
       "the namespaces shared across the cluster; every other name stays on its node"},
      {"cluster_ca_file", Kind::kText, &Config::cluster_ca_file, nullptr, "PATH",
       "PEM: the CA that signed every node's and etcd's certificate"},
      {"cluster_cert_file", Kind::kText, &Config::cluster_cert_file, nullptr, "PATH",
       "PEM: this node's certificate, shown to other nodes and to etcd"},
      {"cluster_key_file", Kind::kText, &Config::cluster_key_file, nullptr, "PATH", "PEM: this node's key"},
      {"cluster_peer_name", Kind::kText, &Config::cluster_peer_name, nullptr, "NAME",
       "the name every node's certificate carries (subjectAltName DNS:NAME), checked instead of the address "
       "other nodes are reached at; for addresses a certificate cannot name in advance, like pods' (default: "
       "the address is checked)"},
      {"cluster_insecure", Kind::kText, &Config::cluster_insecure, nullptr, "on|off",
       "without the TLS files, let brokers and etcd talk in plaintext, unauthenticated (default off)"},
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
  absl::StatusOr<DeviceLimits> limits = ParseDeviceLimits(config.max_device_bytes);
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

// The cluster settings are checked where they are used (server/cluster/); --cluster-etcd
// needs the address it is reached at and what it shares. Without --cluster-etcd the
// others are ignored (the daemon says so): a deployment may set them for every node.
absl::Status CheckCluster(const Config& config, const std::map<std::string, std::string>& origins) {
  if (config.cluster_insecure != "on" && config.cluster_insecure != "off") {
    auto origin = origins.find("cluster_insecure");
    return Invalid(absl::StrCat(origin != origins.end() ? origin->second : "cluster_insecure", " ",
                                common::QuoteForError(config.cluster_insecure), ": must be on or off"));
  }
  if (!config.cluster_etcd.empty() && (config.cluster_listen.empty() || config.cluster_namespaces.empty())) {
    return Invalid("--cluster-etcd needs --cluster-listen (where other brokers reach this one) and "
                   "--cluster-namespaces (what is shared)");
  }
  return absl::OkStatus();
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
  TENSORD_RETURN_IF_ERROR(CheckCluster(config, origins));
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

}  // namespace tensord::server
