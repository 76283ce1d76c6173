#include "server/daemon/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/human_bytes.h"
#include "common/logging.h"
#include "common/memory/backends.h"
#include "common/memory/device_names.h"
#include "common/memory/host/memfd.h"
#include "common/names.h"
#include "common/socket_paths.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "server/broker/broker.h"
#ifdef TENSORD_WITH_UCX
#include "server/cluster/cluster_node.h"
#endif
#include "server/daemon/fd_store.h"
#include "server/daemon/systemd.h"
#include "server/daemon/take_over.h"
#include "server/metrics/metrics_text.h"
#include "server/metrics/rpc_metrics.h"
#include "server/state/registry_snapshot.h"
#include "server/transport/async_server.h"
#include "server/transport/broker_service.h"
#include "server/transport/fd_server.h"
#include "server/transport/grpc_listener.h"
#include "server/transport/health_service.h"
#include "server/transport/metrics_endpoint.h"
#include "server/transport/reflection_service.h"
#include "server/transport/unix_socket.h"
#include "spdlog/spdlog.h"

#ifndef TENSORD_VERSION
#define TENSORD_VERSION "0.0.0"
#endif

namespace tensord::server {
namespace {

constexpr mode_t kSocketMode = 0660;
constexpr uint64_t kFdChannelSlack = 64;
// A client says HELLO as soon as it connects; a connection silent this long is closed.
constexpr std::chrono::milliseconds kHelloTimeout{5000};

// The cap on gRPC connections: the configured one, but never more than half the open-file
// limit, so connections alone cannot leave the daemon without fds for memory and sessions.
uint64_t GrpcConnectionCap(uint64_t configured) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return configured;
  uint64_t half = static_cast<uint64_t>(limit.rlim_cur) / 2;
  if (configured != 0 && configured <= half) return configured;
  spdlog::warn("gRPC connections capped at {}, half the open-file limit ({}), below --max-grpc-connections {}",
               half, limit.rlim_cur, configured);
  return half;
}

// A process sharing many tensors holds many fds in flight: use the hard limit.
void RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      spdlog::debug("open-file limit raised from {} to {}", before, limit.rlim_max);
    }
  }
}

// Creates the socket's directory. The per-user directories must be ours and private.
absl::Status PrepareDirectory(const std::string& socket) {
  std::filesystem::path dir = std::filesystem::path(socket).parent_path();
  if (dir.empty()) return absl::OkStatus();
  bool per_user_default = socket == common::PerUserSocketPath();
  mode_t mode = per_user_default ? 0700 : 0755;
  if (mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
    // Parent directories of an explicit --socket are the operator's to create.
    return common::ErrnoToStatus(absl::StrCat("create socket directory ", dir.string()), errno);
  }
  struct stat info{};
  // lstat: a symlink planted where our directory belongs must not redirect the sockets.
  if (lstat(dir.c_str(), &info) != 0) return common::ErrnoToStatus(absl::StrCat("stat ", dir.string()), errno);
  if (per_user_default &&
      (!S_ISDIR(info.st_mode) || info.st_uid != getuid() || (info.st_mode & 077) != 0)) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "socket directory %s is %s owned by uid %u with mode %04o: refusing to use it (it must "
        "be a directory of uid %u with mode 0700)",
        dir.string(), S_ISDIR(info.st_mode) ? "a directory" : "not a directory", info.st_uid,
        info.st_mode & 07777, getuid()));
  }
  return absl::OkStatus();
}

// Opens (creating it if missing) the lock file beside the socket. Never through a symlink
// (O_NOFOLLOW: in a world-writable directory another uid could point it at any file, which
// a root daemon would create or open), and only a regular file of this daemon's uid: one
// planted by another uid is refused, never locked or used.
absl::StatusOr<common::UniqueFd> OpenLockFile(const std::string& lock_path) {
  common::UniqueFd lock(open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600));
  if (!lock) {
    // ELOOP, or EACCES where O_CREAT meets a link in a sticky directory: ask what is there.
    const int error = errno;
    struct stat planted{};
    if (lstat(lock_path.c_str(), &planted) == 0 && S_ISLNK(planted.st_mode)) {
      return absl::PermissionDeniedError(absl::StrCat("lock file ", lock_path,
                                                      " is a symbolic link: refusing to follow it (remove it)"));
    }
    return common::ErrnoToStatus(absl::StrCat("open lock file ", lock_path), error);
  }
  struct stat info{};
  if (fstat(lock.get(), &info) != 0) return common::ErrnoToStatus(absl::StrCat("stat lock file ", lock_path), errno);
  if (!S_ISREG(info.st_mode) || info.st_uid != geteuid()) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "lock file %s is %s owned by uid %u: refusing to use it (it must be a regular file of this daemon's "
        "uid %u; remove it)",
        lock_path, S_ISREG(info.st_mode) ? "a regular file" : "not a regular file", info.st_uid, geteuid()));
  }
  return lock;
}

// The configured socket path, or under socket activation the path systemd bound, which a
// configured path must agree with (clients and the lock file follow it).
absl::StatusOr<std::string> SocketPath(const Config& config, const std::optional<ActivationSockets>& activated) {
  if (!activated.has_value()) return config.socket.empty() ? common::DefaultDaemonSocketPath() : config.socket;
  const std::string& bound = activated->grpc.path;
  if (!config.socket.empty() && config.socket != bound) {
    return absl::FailedPreconditionError(absl::StrCat("systemd passed a gRPC socket bound to ", bound, " but the socket ",
                                                      "setting (", config.origins.contains("socket") ? config.origins.at("socket") : "socket",
                                                      ") names ", config.socket, ": make them the same"));
  }
  if (activated->fd_channel.path != common::FdChannelPath(bound)) {
    return absl::FailedPreconditionError(absl::StrCat("systemd passed an fd-channel socket bound to ", activated->fd_channel.path,
                                                      ": with the gRPC socket at ", bound, " it must be ",
                                                      common::FdChannelPath(bound)));
  }
  return bound;
}

// Takes `lock` once the daemon that holds it has gone: a take-over's old daemon exits once
// this one serves. Gives up after the old daemon's longest drain and then some.
absl::Status AwaitLock(int lock, const std::string& lock_path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (flock(lock, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return common::ErrnoToStatus(absl::StrCat("lock ", lock_path), errno);
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("take-over: the old daemon still holds ", lock_path,
                                                      " after 30 s; serving without it"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::OkStatus();
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& group) {
  if (group.empty()) return static_cast<gid_t>(-1);  // chown leaves the group alone
  absl::StatusOr<gid_t> gid = LookUpGroup(group);
  if (!gid.ok()) {
    return absl::Status(gid.status().code(), absl::StrCat("socket group ", common::QuoteForError(group), ": ",
                                                          gid.status().message()));
  }
  return gid;
}

// The service manager's one-line view (systemctl status).
std::string StatusLine(const v1::StatusResponse& status) {
  return absl::StrFormat("serving %u tensors (%u named) in %s of %s host memory; %u sessions, %u leases",
                         status.tensors(), status.named_tensors(), common::HumanBytes(status.host_bytes_in_use()),
                         common::HumanBytes(status.host_bytes_limit()), status.sessions(), status.leases());
}

// Cluster settings given without an etcd to join are ignored, saying so.
void WarnIgnoredClusterSettings(const Config& config) {
  for (const auto& [key, origin] : config.origins) {
    if ((key.starts_with("cluster_") || key == "node_name") && key != "cluster_etcd") {
      spdlog::warn("{} is ignored: this node is in no cluster (no --cluster-etcd)", origin);
    }
  }
}

#ifdef TENSORD_WITH_UCX
// The staging helper beside this daemon's binary (both are installed in one directory).
std::string StageHelperPath() {
  std::error_code failed;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", failed);
  return failed ? std::string("tensord-stage") : (self.parent_path() / "tensord-stage").string();
}

// The cluster node the settings ask for (none without --cluster-etcd), joined to `broker`;
// its section of the status goes into `supplements`.
using ClusterNodePtr = std::unique_ptr<cluster::ClusterNode>;
absl::StatusOr<ClusterNodePtr> JoinCluster(const Config& config, Broker& broker, StatusSupplements& supplements) {
  if (config.cluster_etcd.empty()) {
    WarnIgnoredClusterSettings(config);
    return ClusterNodePtr();
  }
  cluster::ClusterOptions options;
  options.etcd_endpoints = absl::StrSplit(config.cluster_etcd, ',', absl::SkipWhitespace());
  options.node = config.node_name;
  if (options.node.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) options.node = host;
  }
  options.listen = config.cluster_listen;
  options.namespaces = absl::StrSplit(config.cluster_namespaces, ',', absl::SkipWhitespace());
  options.tls = {config.cluster_ca_file, config.cluster_cert_file, config.cluster_key_file,
                 config.cluster_insecure == "on"};
  options.peer_name = config.cluster_peer_name;
  options.version = TENSORD_VERSION;
  options.stage_helper = StageHelperPath();
  absl::StatusOr<ClusterNodePtr> node = cluster::ClusterNode::Start(broker, std::move(options));
  if (!node.ok()) return absl::Status(node.status().code(), absl::StrCat("cluster: ", node.status().message()));
  supplements.Set([raw = node->get()](v1::StatusResponse& status) { raw->Describe(*status.mutable_cluster()); });
  return node;
}
#else
using ClusterNodePtr = std::unique_ptr<int>;
absl::StatusOr<ClusterNodePtr> JoinCluster(const Config& config, Broker&, StatusSupplements&) {
  if (config.cluster_etcd.empty()) {
    WarnIgnoredClusterSettings(config);
    return ClusterNodePtr();
  }
  return absl::UnimplementedError(
      "--cluster-etcd: this tensord was built without UCX (Debian: libucx-dev), the cluster's data path");
}
#endif

}  // namespace

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A client that vanishes mid-write must not kill the daemon.
  signal(SIGPIPE, SIG_IGN);
}

absl::Status RunDaemon(const Config& config) {
  TENSORD_RETURN_IF_ERROR(common::SetLogLevel(config.log_level));
  RaiseFileLimit();
  TENSORD_ASSIGN_OR_RETURN(PassedFds passed, TakePassedFds());
  std::optional<ActivationSockets>& activated = passed.sockets;
  TENSORD_ASSIGN_OR_RETURN(std::string socket, SocketPath(config, activated));
  TENSORD_RETURN_IF_ERROR(PrepareDirectory(socket));
  TENSORD_ASSIGN_OR_RETURN(gid_t group, ResolveGroup(config.socket_group));

  // The lock proves we own the socket paths; a second daemon refuses instead of stealing
  // them, unless it takes over: then it takes the lock once the old daemon has gone.
  std::string lock_path = common::LockPath(socket);
  TENSORD_ASSIGN_OR_RETURN(common::UniqueFd lock, OpenLockFile(lock_path));
  if (!config.take_over && flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::AlreadyExistsError(absl::StrCat("another tensord is already serving ", socket, " (", lock_path,
                                                   " is locked); to replace it keeping its tensors, start this "
                                                   "one with --take-over"));
    }
    return common::ErrnoToStatus(absl::StrCat("lock ", lock_path), errno);
  }
  std::optional<TakenOver> taken;
  if (config.take_over) {
    if (activated) return absl::FailedPreconditionError("--take-over and socket activation: use one or the other");
    TENSORD_ASSIGN_OR_RETURN(taken, TakeOverFrom(socket));
    if (taken->grpc.path != socket || taken->fd_channel.path != common::FdChannelPath(socket)) {
      return absl::FailedPreconditionError(absl::StrCat("--take-over: the running tensord's sockets are ",
                                                        taken->grpc.path, " and ", taken->fd_channel.path));
    }
    spdlog::info("taking over from tensord pid {}: {} named tensors, {} buffers", taken->state.pid(),
                 taken->snapshot.tensors_size(), taken->snapshot.buffers_size());
  }

  BrokerOptions options;
  options.max_host_bytes = config.max_host_bytes;
  options.max_sessions = config.max_sessions;
  options.max_leases_per_session = config.max_leases_per_session;
  options.max_waits_per_session = config.max_waits_per_session;
  options.uid_limits[UidResource::kSessions] = config.max_sessions_per_uid;
  options.uid_limits[UidResource::kTensors] = config.max_tensors_per_uid;
  options.uid_limits[UidResource::kWaits] = config.max_waits_per_uid;
  options.uid_limits[UidResource::kWatchers] = config.max_watchers_per_uid;
  options.uid_limits[UidResource::kMetadataBytes] = config.max_metadata_bytes_per_uid;
  options.uid_limits[UidResource::kHostBytes] = config.max_host_bytes_per_uid;
  options.arena_bytes = config.arena_bytes;
  options.arena_max_tensor_bytes = config.arena_max_tensor_bytes;
  options.recycle = {config.recycle_buffers_per_session, config.recycle_bytes_per_session};
  options.daemon_uid = getuid();
  options.acls = config.acls;
  options.socket = socket;
  options.version = TENSORD_VERSION;
  options.device_limits = config.device_limits;
  auto backends = std::make_unique<BackendRegistry>(common::MakeBackends(), common::MissingBackends());
  // Operators see at once which memory kinds this daemon serves, and why not the others.
  for (const v1::BackendStatus& backend : backends->Describe()) {
    if (!backend.unavailable_reason().empty()) {
      spdlog::info("memory backend {}: {}: {}", backend.name(), backend.built() ? "unavailable" : "not built",
                   backend.unavailable_reason());
      continue;
    }
    for (const v1::DeviceUsage& device : backend.devices()) {
      spdlog::info("memory backend {}: device {} {} ({})", backend.name(), device.device().index(),
                   device.name(), common::DeviceKey(device.device()));
    }
  }
  Broker broker(std::move(options), std::move(backends));
  // What systemd kept for this service (fd_store.h): every name goes from the store once
  // restored; the fd store, when on, stores what this daemon holds under its own ids.
  StartedWith started_with;
  std::set<std::string> stored_names;
  for (const auto& [name, fds] : passed.stored) stored_names.insert(name);
  if (!passed.stored.empty()) {
    absl::StatusOr<std::optional<RecoveredState>> recovered = RecoverFromStore(passed.stored);
    if (!recovered.ok()) {
      spdlog::error("systemd's fd store: {}; starting empty", recovered.status().ToString());
    } else if (!recovered->has_value()) {
      spdlog::warn("systemd passed {} stored fds but no registry; starting empty", stored_names.size());
    } else {
      Broker::RestoreReport restored = broker.Restore((*recovered)->snapshot, std::move((*recovered)->fds));
      started_with = {"fd-store", restored.tensors, restored.refused};
      spdlog::info("restored {} named tensors in {} buffers ({}) from systemd's fd store ({}){}", restored.tensors,
                   restored.buffers, common::HumanBytes(restored.bytes), (*recovered)->registry_name,
                   restored.refused == 0 ? std::string()
                                         : absl::StrCat("; refused ", restored.refused, " entries (logged above)"));
    }
    passed.stored.clear();  // what Restore did not take is closed here
  }
  if (taken) {
    Broker::RestoreReport restored = broker.Restore(taken->snapshot, std::move(taken->buffer_fds));
    started_with = {"take-over", restored.tensors, restored.refused};
    spdlog::info("took over {} named tensors in {} buffers ({}){}", restored.tensors, restored.buffers,
                 common::HumanBytes(restored.bytes),
                 restored.refused == 0 ? std::string()
                                       : absl::StrCat("; refused ", restored.refused, " entries (logged above)"));
  }

  // The server listens on no port of its own: GrpcListener accepts, notes each connection's
  // credentials and hands it over.
  // Every method, health and reflection included, is served by AsyncServer's one thread.
  GrpcListener listener;
  AsyncServer async_server;
  RpcMetrics rpc_metrics;
  StatusSupplements status_supplements;  // the cluster's section, once the node has joined
  BrokerService service(&broker, &listener, &rpc_metrics, &status_supplements);
  service.Register(&async_server);
  HealthService health({"tensord.v1.Broker"});
  health.Register(&async_server);
  ReflectionService reflection;
  reflection.Register(&async_server);
  grpc::ServerBuilder builder;
  async_server.Configure(&builder);
  builder.SetMaxReceiveMessageSize(64 * 1024 * 1024);
  // Clients are on this node, over a Unix socket: no bandwidth-delay product to probe, and
  // the probe's pings cost CPU on every read of the hot path. Without the probe the window
  // would stay at 64 KiB: a client that pipelines requests faster than it reads replies
  // (the broker stops reading a stream whose replies pile up) needs room for its requests.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return absl::UnavailableError("cannot start the gRPC server");
  async_server.Start(server.get());
  auto stop_server = [&] { async_server.Shutdown(std::chrono::milliseconds(0)); };
  const std::vector<uid_t> trusted_uids = {0, getuid()};
  ConnectionCaps grpc_caps;
  grpc_caps.total = GrpcConnectionCap(config.max_grpc_connections);
  grpc_caps.total_flag = "--max-grpc-connections";
  grpc_caps.per_uid = config.max_connections_per_uid;
  grpc_caps.exempt_uids = trusted_uids;
  absl::StatusOr<ListeningSocket> grpc_socket = activated ? std::move(activated->grpc)
                                               : taken   ? std::move(taken->grpc)
                                                         : ListenUnix(socket, SOCK_STREAM, kSocketMode, group);
  if (!grpc_socket.ok()) {
    stop_server();
    return grpc_socket.status();
  }
  if (absl::Status listening = listener.Start(*std::move(grpc_socket), server.get(), grpc_caps); !listening.ok()) {
    stop_server();
    return listening;
  }
  // The fd channel opens last: a client connects to it first, so once it accepts, the gRPC
  // socket is already there (a client racing a restart never meets a stale gRPC socket and
  // gRPC's reconnect backoff).
  // Pending connections before HELLO get a little room above the session cap.
  ConnectionCaps fd_caps;
  fd_caps.total = config.max_sessions + kFdChannelSlack;
  fd_caps.total_flag = "--max-sessions plus room for connections before HELLO:";
  fd_caps.per_uid = config.max_connections_per_uid;
  fd_caps.exempt_uids = trusted_uids;
  FdServer fd_server(&broker, fd_caps, kHelloTimeout,
                     [&listener](uid_t uid) { return listener.CheckRoomFor(uid); });
  absl::StatusOr<ListeningSocket> fd_socket =
      activated ? std::move(activated->fd_channel)
      : taken   ? std::move(taken->fd_channel)
                : ListenUnix(common::FdChannelPath(socket), SOCK_SEQPACKET, kSocketMode, group);
  absl::Status started = fd_socket.ok() ? fd_server.Start(*std::move(fd_socket)) : fd_socket.status();
  if (!started.ok()) {
    listener.Stop();
    stop_server();
    return started;
  }
  spdlog::info(
      "tensord {} serving on {} (fd channel {}), host memory limit {} ({}), at most {} sessions, "
      "{} leases and {} waits per session, {}{}",
      TENSORD_VERSION, socket, common::FdChannelPath(socket), common::HumanBytes(config.max_host_bytes),
      config.max_host_bytes_source.empty() ? "set by the caller" : config.max_host_bytes_source, config.max_sessions,
      config.max_leases_per_session, config.max_waits_per_session,
      config.arena_bytes == 0
          ? std::string("arenas off")
          : absl::StrCat("arenas of ", common::HumanBytes(config.arena_bytes), " for tensors up to ",
                         common::HumanBytes(config.arena_max_tensor_bytes)),
      config.config_file.empty() ? "" : absl::StrCat(", config ", config.config_file));
  if (activated) spdlog::info("sockets passed by systemd (socket activation); they stay when tensord stops");
  const std::string huge = common::ShmemHugePages();
  spdlog::info("host memory: recycled buffers {}; transparent huge pages for tensor memory: {} "
               "(shmem_enabled {}; docs/performance.md says what to set)",
               config.recycle_bytes_per_session == 0
                   ? std::string("off")
                   : absl::StrCat("up to ", config.recycle_buffers_per_session, " and ",
                                  common::HumanBytes(config.recycle_bytes_per_session), " per producer session"),
               huge == "always" || huge == "within_size" || huge == "force" ? "yes" : "no", huge);

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  // Metrics come last: a scrape only reads what serving has built. A daemon that takes over
  // starts them once the old one has gone, which may hold the same address.
  MetricsEndpoint metrics;
  auto start_metrics = [&]() -> absl::Status {
    if (config.metrics_address.empty()) return absl::OkStatus();
    absl::StatusOr<MetricsAddress> address = ParseMetricsAddress(config.metrics_address);  // checked by LoadConfig
    absl::StatusOr<std::string> where =
        !address.ok() ? absl::StatusOr<std::string>(address.status())
                      : metrics.Start(*address, kSocketMode, group,
                                      [&broker, &rpc_metrics, &started_with, &status_supplements] {
                                        v1::StatusRequest request;
                                        request.set_include_namespaces(true);
                                        v1::StatusResponse status = broker.GetStatus(request);
                                        status_supplements.FillIn(status);
                                        return PrometheusText(status, rpc_metrics, started_with);
                                      });
    if (!where.ok()) return absl::Status(where.status().code(), absl::StrCat("metrics endpoint: ", where.status().message()));
    spdlog::info("metrics: GET /metrics at {}", *where);
    return absl::OkStatus();
  };
  if (taken) {
    // Serving: the old daemon ends its sessions and exits, and its lock comes free.
    if (absl::Status told = taken->Serving(); !told.ok()) {
      spdlog::warn("take-over: cannot tell the old daemon that this one serves: {}", told.ToString());
    }
    if (absl::Status locked = AwaitLock(lock.get(), lock_path); !locked.ok()) {
      spdlog::error("{}", locked.ToString());
    }
  }
  if (absl::Status started_metrics = start_metrics(); !started_metrics.ok()) {
    fd_server.Stop();
    listener.Stop();
    stop_server();
    return started_metrics;
  }
  // This daemon can be taken over in turn. The handler runs on the listener's thread; the
  // drain below stops that thread before it touches what the handler uses.
  std::atomic<bool> handed_over{false};
  TakeOverListener take_over_listener;
  auto hand_over = [&](common::UniqueFd connection) {
    HandOverSession session(std::move(connection));
    if (absl::Status asked = session.ReadRequest(); !asked.ok()) {
      spdlog::warn("take-over refused: {}", asked.ToString());
      return;
    }
    // From here new connections wait in the sockets' backlogs for the new daemon.
    ListeningSocket grpc_listening = listener.Release();
    absl::Status status = fd_server.PauseAccepting();
    Broker::Snapshot snapshot = broker.FreezeAndSnapshot();
    absl::StatusOr<common::UniqueFd> memfd =
        status.ok() ? WriteSnapshotMemfd(snapshot.registry) : absl::StatusOr<common::UniqueFd>(status);
    v1::TakeOverState state;
    state.set_socket(socket);
    state.set_pid(static_cast<uint32_t>(getpid()));
    status = memfd.ok() ? session.Send(state, memfd->get(), grpc_listening.fd.get(), fd_server.listening_fd(),
                                       snapshot.fds)
                        : memfd.status();
    if (status.ok()) status = session.AwaitServing();
    if (status.ok()) {
      spdlog::info("handed {} named tensors over to the new daemon ({} not carried); ending sessions",
                   snapshot.registry.tensors_size(), snapshot.dropped);
      // The socket files are the new daemon's now.
      grpc_listening.remove_on_close = false;
      fd_server.KeepSocketFile();
      take_over_listener.KeepFile();
      handed_over = true;
      kill(getpid(), SIGTERM);  // the main thread's sigwait drains and exits
      return;
    }
    spdlog::error("take-over failed: {}; this daemon serves on", status.ToString());
    broker.Unfreeze();
    if (absl::Status resumed = listener.Start(std::move(grpc_listening), server.get(), grpc_caps); !resumed.ok()) {
      spdlog::error("gRPC socket: {}", resumed.ToString());
    }
    if (absl::Status resumed = fd_server.ResumeAccepting(); !resumed.ok()) spdlog::error("{}", resumed.ToString());
  };
  if (absl::Status listening = take_over_listener.Start(socket, hand_over); !listening.ok()) {
    spdlog::warn("take-over socket {}: {}; this daemon cannot be taken over", TakeOverPath(socket),
                 listening.ToString());
  }
  FdStore fd_store(&broker);
  SystemdNotifier notifier;
  if (config.fd_store == "on" && notifier.enabled()) {
    fd_store.Start(stored_names);
    spdlog::info("named tensors are kept in systemd's fd store, synced every {} ms", kFdStoreSyncPeriod.count());
  } else {
    if (config.fd_store == "on") spdlog::warn("fd_store is on but no service manager listens (NOTIFY_SOCKET): off");
    // Names systemd passed back that no fd store will replace.
    for (const std::string& name : stored_names) sd_notifyf(0, "FDSTOREREMOVE=1\nFDNAME=%s", name.c_str());
  }
  absl::StatusOr<ClusterNodePtr> cluster = JoinCluster(config, broker, status_supplements);
  if (!cluster.ok()) {
    take_over_listener.Stop();
    fd_store.Stop();
    fd_server.Stop();
    listener.Stop();
    metrics.Stop();
    broker.Shutdown();
    stop_server();
    return cluster.status();
  }
  notifier.Ready([&broker] { return StatusLine(broker.GetStatus()); });
  int signal_number = 0;
  while (sigwait(&set, &signal_number) != 0) {
  }
  // Before anything a hand-over uses goes: waits for one in progress.
  take_over_listener.Stop();
  fd_store.Stop();
  const std::string why = handed_over ? std::string("handed over to a new daemon")
                                      : absl::StrCat(strsignal(signal_number), " received");
  spdlog::info("{}: draining", why);
  notifier.Stopping(absl::StrCat(why, ": draining"));

  // Stop taking new sessions, end the streams that never finish by themselves, then let
  // in-flight calls complete for up to 5 s.
  listener.Stop();
  metrics.Stop();
  health.SetNotServing();
  status_supplements.Clear();  // waits for a status call that reads the node
  cluster->reset();            // leaves the cluster: this node's names leave the directory
  broker.Shutdown();
  async_server.Shutdown(std::chrono::seconds(5));
  fd_server.Stop();
  spdlog::info("tensord stopped");
  return absl::OkStatus();
}

}  // namespace tensord::server
