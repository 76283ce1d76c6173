// The gRPC connection's peer check and its life, against a listener of this process: who may
// serve the gRPC socket, that a refused peer receives not one byte, that every socket the
// connection holds is close-on-exec, and that Closed() sees the connection go.
#include "client/grpc_connection.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::internal {
namespace {

using common::PeerCredentials;
using common::UniqueFd;
using common::testing::IsOk;
using common::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint32_t kTrusted[] = {4242};
const std::string kSocket = "/run/t/tensord.sock";

TEST(GrpcPeerTest, TheFdChannelsDaemonIsAccepted) {
  const PeerCredentials daemon{0, 0, 99};
  EXPECT_THAT(CheckGrpcPeer({0, 0, 99}, daemon, 1000, kTrusted, kSocket), IsOk());
  EXPECT_THAT(CheckGrpcPeer({1000, 1000, 7}, {1000, 1000, 7}, 1000, kTrusted, kSocket), IsOk());
  EXPECT_THAT(CheckGrpcPeer({4242, 1, 7}, {4242, 1, 7}, 1000, kTrusted, kSocket), IsOk());
}

TEST(GrpcPeerTest, AnotherProcessIsRefusedEvenAsATrustedUid) {
  EXPECT_THAT(CheckGrpcPeer({65534, 65534, 1234}, {0, 0, 99}, 1000, kTrusted, kSocket),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("the gRPC socket /run/t/tensord.sock is served by uid 65534 (pid "
                                 "1234), not by the tensord on /run/t/tensord.sock.fd (uid 0, pid "
                                 "99): refusing to send the session token")));
  // Root, but not the daemon's process.
  EXPECT_THAT(CheckGrpcPeer({0, 0, 100}, {0, 0, 99}, 1000, kTrusted, kSocket),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("(pid 100)")));
}

TEST(GrpcPeerTest, WithoutPidsTheUidsAreCompared) {
  // SO_PEERCRED reports pid 0 for a process outside our pid namespace.
  EXPECT_THAT(CheckGrpcPeer({0, 0, 0}, {0, 0, 0}, 1000, kTrusted, kSocket), IsOk());
  EXPECT_THAT(CheckGrpcPeer({0, 0, 0}, {0, 0, 99}, 1000, kTrusted, kSocket), IsOk());
  EXPECT_THAT(CheckGrpcPeer({4242, 0, 55}, {4242, 0, 0}, 1000, kTrusted, kSocket), IsOk());
  EXPECT_THAT(CheckGrpcPeer({65534, 0, 0}, {0, 0, 99}, 1000, kTrusted, kSocket),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("uid 65534 (pid unknown: another pid namespace)"),
                             HasSubstr("(uid 0, pid 99)"))));
  // The same uid as the daemon but one we do not trust (the daemon itself would have been
  // refused on the fd channel): refused all the same.
  EXPECT_THAT(CheckGrpcPeer({31337, 0, 0}, {31337, 0, 0}, 1000, kTrusted, kSocket),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("uid 31337"), HasSubstr("trusted_daemon_uids"))));
}

// A listening gRPC socket of this process in a private directory.
class GrpcConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tensord-grpc-connection-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/tensord.sock";
    listener_.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(listener_.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path_.c_str());
    ASSERT_EQ(bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(listen(listener_.get(), 4), 0);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The daemon of the fd channel: this process.
  static PeerCredentials Us() { return {getuid(), getgid(), getpid()}; }

  UniqueFd Accept() { return UniqueFd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC)); }

  std::string dir_;
  std::string path_;
  UniqueFd listener_;
};

// Every socket fd of this process: (fd, close-on-exec).
std::vector<std::pair<int, bool>> Sockets() {
  std::vector<std::pair<int, bool>> sockets;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    struct stat info {};
    if (fstat(fd, &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    sockets.emplace_back(fd, (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
  }
  return sockets;
}

TEST_F(GrpcConnectionTest, TheDaemonsSocketMakesAChannelThatSeesTheConnectionGo) {
  auto connection = GrpcConnection::Connect(path_, Us(), {});
  ASSERT_THAT(connection, IsOk());
  ASSERT_NE((*connection)->stub(), nullptr);
  UniqueFd server = Accept();
  ASSERT_TRUE(server.valid());
  // The listener, its accepted end, our socket (gRPC's) and its duplicate: none leaks into a
  // program this process execs.
  std::vector<std::pair<int, bool>> sockets = Sockets();
  EXPECT_GE(sockets.size(), 4u);
  for (const auto& [fd, cloexec] : sockets) EXPECT_TRUE(cloexec) << "socket fd " << fd;
  EXPECT_FALSE((*connection)->Closed());
  // The broker closes the connection: seen at once, without any call made on it.
  server.reset();
  EXPECT_TRUE((*connection)->Closed());
}

TEST_F(GrpcConnectionTest, ShuttingItDownClosesIt) {
  auto connection = GrpcConnection::Connect(path_, Us(), {});
  ASSERT_THAT(connection, IsOk());
  UniqueFd server = Accept();
  EXPECT_FALSE((*connection)->Closed());
  (*connection)->ShutdownForTest();
  EXPECT_TRUE((*connection)->Closed());
  // The broker's end sees the connection end too.
  pollfd pfd{server.get(), POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 5000), 1);
}

TEST_F(GrpcConnectionTest, AnotherProcessGetsNotOneByte) {
  PeerCredentials elsewhere = Us();
  elsewhere.pid = getpid() + 1;  // the fd channel's daemon is some other process
  auto connection = GrpcConnection::Connect(path_, elsewhere, {});
  EXPECT_THAT(connection,
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("the gRPC socket " + path_), HasSubstr(path_ + ".fd"),
                             HasSubstr("refusing to send the session token"))));
  // The connection was made (to read its peer) and closed before anything was written.
  UniqueFd server = Accept();
  ASSERT_TRUE(server.valid());
  char byte;
  EXPECT_EQ(recv(server.get(), &byte, 1, MSG_DONTWAIT), 0) << "the refused peer received data";
}

TEST_F(GrpcConnectionTest, NothingListeningIsUnavailable) {
  listener_.reset();
  unlink(path_.c_str());
  EXPECT_THAT(GrpcConnection::Connect(path_, Us(), {}),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr(path_), HasSubstr("no daemon listens there"))));
}

}  // namespace
}  // namespace tensord::internal
