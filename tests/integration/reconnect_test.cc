// The gRPC connection of a live session, against the real `tensord` binary: the client makes
// it from a socket it connected and checked itself, so gRPC never reconnects it; the session
// must make a new one when the broker closed it, and after a fork(). Links the static client
// (tensord_client_core) to reach a session's connection through internal::ClientPeer.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/client_peer.h"
#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/test_client.h"

namespace tensord {
namespace {

using testing::DaemonProcess;
using testing::Options;

std::shared_ptr<internal::ClientPeer> Core(const DaemonProcess& daemon) {
  auto core = internal::ClientPeer::Create(Options(daemon));
  EXPECT_TRUE(core.ok()) << core.status().ToString();
  return core.ok() ? std::move(core).value() : nullptr;
}

std::shared_ptr<internal::Session> SessionOf(internal::ClientPeer& core) {
  auto session = core.CurrentSession();
  EXPECT_TRUE(session.ok()) << session.status().ToString();
  return session.ok() ? *session : nullptr;
}

// Publishes float32[4] of `value` as `name` and reads it back through an acquire.
Status RoundTrip(internal::ClientPeer& core, const std::string& name, float value) {
  TensorSpec spec;
  spec.shape = {4};
  Result<TensorRef> tensor = core.Allocate("ns", spec);
  if (!tensor.ok()) return tensor.status();
  for (int i = 0; i < 4; ++i) static_cast<float*>(tensor->mutable_data())[i] = value;
  Result<TensorInfo> published = core.Publish(*tensor, name, {});
  if (!published.ok()) return published.status();
  Result<TensorRef> acquired = core.Acquire(name, {});
  if (!acquired.ok()) return acquired.status();
  if (static_cast<const float*>(acquired->data())[3] != value) {
    return Status(StatusCode::kDataLoss, "read back another value");
  }
  return Status();
}

TEST(Reconnect, AConnectionTheBrokerClosedIsMadeAgainWithinTheSameSession) {
  DaemonProcess daemon;
  auto core = Core(daemon);
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(RoundTrip(*core, "ns/before", 1.0f).ok());
  auto session = SessionOf(*core);
  const uint64_t session_id = session->session_id();
  auto first = session->grpc_connection_for_test();
  ASSERT_NE(first, nullptr);
  ASSERT_FALSE(first->Closed());

  // Gone as if the broker had closed it (it may, over a per-uid connection limit).
  first->ShutdownForTest();
  ASSERT_TRUE(first->Closed());

  // A unary call checks the connection first and makes a new one.
  Result<std::vector<TensorInfo>> listed = core->List("");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), 1u);
  auto second = session->grpc_connection_for_test();
  EXPECT_NE(second, first);
  EXPECT_FALSE(second->Closed());
  // The Session stream rode the old connection: a call on it fails at once with UNAVAILABLE
  // (never hangs), and the next opens a stream on the new connection.
  Status flushed = core->Flush();
  if (!flushed.ok()) {
    EXPECT_EQ(flushed.code(), StatusCode::kUnavailable) << flushed.ToString();
    flushed = core->Flush();
  }
  ASSERT_TRUE(flushed.ok()) << flushed.ToString();
  EXPECT_EQ(session->grpc_connection_for_test(), second);
  ASSERT_TRUE(RoundTrip(*core, "ns/after", 2.0f).ok());

  // Still the same session, and the only one.
  EXPECT_EQ(SessionOf(*core), session);
  EXPECT_EQ(core->session_id(), session_id);
  Result<BrokerStatus> status = core->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(status->sessions, 1u);
}

TEST(Reconnect, EverySocketOfTheClientIsCloseOnExec) {
  DaemonProcess daemon;
  auto core = Core(daemon);
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(RoundTrip(*core, "ns/x", 1.0f).ok());
  int sockets = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    struct stat info {};
    if (fstat(fd, &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    ++sockets;
    EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << "socket fd " << fd;
  }
  // The fd channel, the gRPC socket and the duplicate the client watches it through.
  EXPECT_GE(sockets, 3);
}

TEST(Reconnect, AForkDropsTheConnectionAndBothSidesConnectAgain) {
  DaemonProcess daemon;
  auto core = Core(daemon);
  ASSERT_NE(core, nullptr);
  ASSERT_TRUE(RoundTrip(*core, "ns/before", 1.0f).ok());
  auto session = SessionOf(*core);
  // Weak: a connection held here would keep gRPC up across the fork.
  std::weak_ptr<internal::GrpcConnection> before = session->grpc_connection_for_test();
  ASSERT_FALSE(before.expired());

  pid_t child = fork();
  if (child == 0) {
    // A session and a connection of the child's own.
    const bool ok = RoundTrip(*core, "ns/child", 3.0f).ok() && core->session_id() != 0 &&
                    SessionOf(*core) != session;
    std::_Exit(ok ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0);

  // The parent dropped its connection for the fork (so gRPC could shut down) and makes a new
  // one on its next call, in the same session.
  EXPECT_TRUE(before.expired());
  ASSERT_TRUE(RoundTrip(*core, "ns/after", 2.0f).ok());
  EXPECT_EQ(SessionOf(*core), session);
  EXPECT_NE(session->grpc_connection_for_test(), nullptr);
  Result<std::vector<TensorInfo>> listed = core->List("ns/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), 3u);  // before, child, after
}

}  // namespace
}  // namespace tensord
