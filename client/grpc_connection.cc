#include "client/grpc_connection.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/fd_connection.h"
#include "client/status_util.h"
#include "common/socket_paths.h"
#include "common/status.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/support/channel_arguments.h"

#ifndef GPR_SUPPORT_CHANNELS_FROM_FD
#error "tensord's client needs gRPC channels made from a connected fd"
#endif

namespace tensord::internal {
namespace {

std::string Pid(pid_t pid) {
  return pid != 0 ? absl::StrCat("pid ", pid) : "pid unknown: another pid namespace";
}

grpc::ChannelArguments ChannelArgs() {
  grpc::ChannelArguments args;
  // A subchannel pool of its own and no idle timeout: what a channel made from a target needs
  // so that nothing is shared with another Session's channel and no idle timer keeps gRPC
  // alive across fork() preparation. A channel made from an fd has neither a subchannel nor
  // the idle filter; they are kept so that the channel is configured the same either way.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, std::numeric_limits<int>::max());
  // A Unix socket has no bandwidth-delay product to probe: BDP pings are pure per-message
  // overhead on the hot path.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // The :authority a "unix:" target sends (gRPC's default for an fd is "test.authority").
  args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, "localhost");
  return args;
}

}  // namespace

absl::Status CheckGrpcPeer(const common::PeerCredentials& peer,
                           const common::PeerCredentials& daemon, uid_t our_uid,
                           std::span<const uint32_t> trusted_uids, const std::string& socket_path) {
  // Within one pid namespace the pid names the process; across one, SO_PEERCRED gives 0 and
  // the uid is all there is to compare.
  const bool same_daemon =
      peer.pid != 0 && daemon.pid != 0 ? peer.pid == daemon.pid : peer.uid == daemon.uid;
  if (!same_daemon) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the gRPC socket ", socket_path, " is served by uid ", peer.uid, " (", Pid(peer.pid),
        "), not by the tensord on ", common::FdChannelPath(socket_path), " (uid ", daemon.uid,
        ", ", Pid(daemon.pid), "): refusing to send the session token"));
  }
  if (!CheckDaemonUid(peer.uid, our_uid, trusted_uids, socket_path).ok()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the gRPC socket ", socket_path, " is served by uid ", peer.uid, " (", Pid(peer.pid),
        "), which is neither root, our uid ", our_uid,
        ", nor in trusted_daemon_uids ($TENSORD_TRUSTED_DAEMON_UIDS): refusing to send the session token"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<GrpcConnection>> GrpcConnection::Connect(
    const std::string& socket_path, const common::PeerCredentials& daemon,
    std::span<const uint32_t> trusted_uids) {
  TENSORD_ASSIGN_OR_RETURN(common::UniqueFd socket, common::ConnectStream(socket_path));
  absl::StatusOr<common::PeerCredentials> peer = common::GetPeerCredentials(socket.get());
  if (!peer.ok()) return Annotate(peer.status(), "gRPC socket " + socket_path);
  TENSORD_RETURN_IF_ERROR(CheckGrpcPeer(*peer, daemon, ::getuid(), trusted_uids, socket_path));

  std::shared_ptr<GrpcConnection> connection(new GrpcConnection());
  connection->watch_.reset(::fcntl(socket.get(), F_DUPFD_CLOEXEC, 0));
  if (!connection->watch_) {
    return common::ErrnoToStatus("gRPC socket " + socket_path + ": duplicate the socket", errno);
  }
  // gRPC owns the socket from here on (it sets O_NONBLOCK, which leaves FD_CLOEXEC alone).
  connection->channel_ = grpc::CreateCustomInsecureChannelFromFd("unix:" + socket_path,
                                                                 socket.release(), ChannelArgs());
  connection->stub_ = tensord::v1::Broker::NewStub(connection->channel_);
  return connection;
}

bool GrpcConnection::Closed() const {
  return common::PeerHungUp(watch_.get());
}

void GrpcConnection::ShutdownForTest() { ::shutdown(watch_.get(), SHUT_RDWR); }

}  // namespace tensord::internal
