// Crash tests with real processes: consumers and producers killed with SIGKILL at the
// worst moments, and the daemon itself killed and restarted under its clients. After each,
// the daemon's own counters and its /proc entry show that nothing leaked.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/proc_info.h"
#include "tests/integration/publish_filled.h"
#include "tests/integration/test_client.h"

namespace tensord {
namespace {

using testing::ChildProcess;
using testing::Connect;
using testing::CountFds;
using testing::DaemonProcess;
using testing::FdTargets;
using testing::PeerArgs;
using testing::PublishFilled;
using namespace std::chrono_literals;

// What must come back to where it was once every killed process is gone.
struct Footprint {
  uint64_t tensors = 0;
  uint64_t buffers = 0;
  uint64_t leases = 0;
  uint64_t sessions = 0;
  uint64_t host_bytes = 0;
  int fds = 0;
  bool operator==(const Footprint&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Footprint& f) {
  return out << "{tensors " << f.tensors << ", buffers " << f.buffers << ", leases " << f.leases
             << ", sessions " << f.sessions << ", host bytes " << f.host_bytes << ", fds " << f.fds
             << "}";
}

Footprint Measure(Client& client, pid_t daemon_pid) {
  Footprint f;
  auto status = client.GetStatus();
  EXPECT_TRUE(status.ok()) << status.status().ToString();
  if (status.ok()) {
    f.tensors = status->tensors;
    f.buffers = status->buffers;
    f.leases = status->leases;
    f.sessions = status->sessions;
    f.host_bytes = status->host_bytes_in_use;
  }
  f.fds = CountFds(daemon_pid);
  return f;
}

// The footprint once it has held still for 250 ms: the baseline a test compares with. Right
// after a connect, a connection closed just before (the fixture's readiness probe) may still
// be closing on the daemon's side and hold an fd.
Footprint StableFootprint(Client& client, pid_t daemon_pid) {
  return testing::HeldStill([&] { return Measure(client, daemon_pid); });
}

// Polls until the footprint equals `want` (10 s); returns the last one seen.
Footprint AwaitFootprint(Client& client, pid_t daemon_pid, const Footprint& want) {
  Footprint now = Measure(client, daemon_pid);
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!(now == want) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    now = Measure(client, daemon_pid);
  }
  return now;
}

TEST(Crash, KilledConsumersAndProducersLeakNothing) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_TRUE(PublishFilled(*client, "ns/shared", 1 << 16, 1.5f).ok());
  ASSERT_TRUE(client->Flush().ok());
  const Footprint baseline = StableFootprint(*client, daemon.pid());
  ASSERT_EQ(baseline.tensors, 1u);
  ASSERT_EQ(baseline.leases, 0u);

  for (int round = 0; round < 5; ++round) {
    std::vector<std::unique_ptr<ChildProcess>> peers;
    for (int i = 0; i < 4; ++i) {
      peers.push_back(std::make_unique<ChildProcess>(PeerArgs({"hold", daemon.socket(), "ns/shared"})));
    }
    // Killed between Allocate and Publish, never published: a 2 MiB tensor in a dedicated
    // buffer, and a 4 KiB one in the (first, 256 KiB) arena that its session made.
    peers.push_back(std::make_unique<ChildProcess>(PeerArgs({"allocate", daemon.socket(), "ns", "524288"})));
    peers.push_back(std::make_unique<ChildProcess>(PeerArgs({"allocate", daemon.socket(), "ns", "1024"})));
    for (size_t i = 0; i < peers.size(); ++i) {
      ASSERT_NE(peers[i]->WaitForLine(i < 4 ? "held" : "allocated"), "") << "peer " << i;
    }
    auto busy = client->GetStatus();
    ASSERT_TRUE(busy.ok());
    EXPECT_EQ(busy->leases, 6u);  // 4 consumers + 2 producers' own leases
    EXPECT_EQ(busy->host_bytes_in_use, baseline.host_bytes + (2 << 20) + (256 << 10));
    for (auto& peer : peers) {
      int status = peer->Kill(SIGKILL);
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    }
    Footprint after = AwaitFootprint(*client, daemon.pid(), baseline);
    EXPECT_EQ(after, baseline) << "round " << round << "; the daemon's fds:\n" << FdTargets(daemon.pid());
  }
  ASSERT_TRUE(client->Delete("ns/shared").ok());
  // The tensor's slot is free; its arena stays as this client's pool while it is connected.
  Footprint empty = baseline;
  empty.tensors = 0;
  EXPECT_EQ(AwaitFootprint(*client, daemon.pid(), empty), empty);
  client.reset();
  auto observer = Connect(daemon);
  empty.buffers = empty.host_bytes = 0;
  empty.fds = baseline.fds - 1;  // the arena's memfd
  EXPECT_EQ(AwaitFootprint(*observer, daemon.pid(), empty), empty);
}

TEST(Crash, KilledDaemonGivesUnavailableKeepsMappingsAndClientsReconnect) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_TRUE(PublishFilled(*client, "ns/kept", 4096, 7.0f).ok());
  auto held = client->Acquire("ns/kept");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  const float* data = static_cast<const float*>(held->data());

  int status = daemon.Kill(SIGKILL);
  ASSERT_TRUE(WIFSIGNALED(status));

  // Mappings already held stay readable: the memory is the client's mapping now.
  for (int i = 0; i < 4096; i += 511) ASSERT_EQ(data[i], 7.0f);
  // Calls fail UNAVAILABLE, with a message that says where and what.
  auto missing = client->Acquire("ns/kept");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kUnavailable) << missing.status().ToString();
  EXPECT_FALSE(missing.status().message().empty());
  auto listed = client->List("");
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(listed.status().message().find(daemon.socket()), std::string::npos)
      << listed.status().message();

  // The daemon comes back on the same socket (stale socket files and all): the same Client
  // reconnects on its next call. Names did not survive the restart.
  daemon.Start();
  Result<std::vector<TensorInfo>> relisted = Status(StatusCode::kUnavailable, "not tried");
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!relisted.ok() && std::chrono::steady_clock::now() < deadline) {
    relisted = client->List("");
    if (!relisted.ok()) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(relisted.ok()) << relisted.status().ToString();
  EXPECT_TRUE(relisted->empty());
  ASSERT_TRUE(PublishFilled(*client, "ns/kept", 16, 3.0f).ok());
  auto fresh = client->Acquire("ns/kept");
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(static_cast<const float*>(fresh->data())[15], 3.0f);
  // The old view is still the old data, and letting it go is harmless.
  EXPECT_EQ(data[4095], 7.0f);
  held = Status(StatusCode::kCancelled, "dropped");
  fresh = Status(StatusCode::kCancelled, "dropped");
  ASSERT_TRUE(client->Flush().ok());
  auto after = client->GetStatus();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->leases, 0u);
  EXPECT_EQ(after->sessions, 1u);
}

TEST(Crash, ProcessesKilledWhileWaitingLeaveNoWaitBehind) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  const Footprint baseline = StableFootprint(*client, daemon.pid());
  std::vector<std::unique_ptr<ChildProcess>> waiters;
  for (int i = 0; i < 8; ++i) {
    // Waits forever for a name nobody has published yet.
    waiters.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{TENSORD_LOAD_PEER, "wait-hold", daemon.socket(), "ns/later"}));
  }
  // Let them reach the broker, then kill them all mid-wait.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (client->GetStatus()->sessions < baseline.sessions + waiters.size() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  for (auto& waiter : waiters) waiter->Kill(SIGKILL);
  EXPECT_EQ(AwaitFootprint(*client, daemon.pid(), baseline), baseline) << FdTargets(daemon.pid());
  // A publish now must not be handed to any of the dead waiters.
  ASSERT_TRUE(PublishFilled(*client, "ns/later", 8, 1.0f).ok());
  ASSERT_TRUE(client->Flush().ok());  // the producer's own lease
  auto stat = client->Stat("ns/later");
  ASSERT_TRUE(stat.ok());
  EXPECT_EQ(stat->info.lease_count, 0u);
  EXPECT_TRUE(stat->holders.empty());
}

// The token a killed sender handed over still gives the tensor, zero-copy, to a receiver
// that comes after the kill; once the receiver lets go nothing is left.
TEST(Crash, AHandOverOutlivesItsKilledSenderAndIsRedeemedOnce) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  const Footprint baseline = StableFootprint(*client, daemon.pid());
  // Published by a process of its own, so that no pool or arena of ours keeps memory.
  ChildProcess producer(PeerArgs({"produce", daemon.socket(), "ns/batch", "1024", "2.5"}));
  ASSERT_NE(producer.WaitForLine("published"), "");
  ChildProcess sender(PeerArgs({"hand-over", daemon.socket(), "ns/batch", "60000"}));
  const std::string line = sender.WaitForLine("token ");
  ASSERT_NE(line, "") << "the sender printed no token";
  std::istringstream words(line.substr(6));
  std::string token;
  double sent_sum = 0;
  words >> token >> sent_sum;
  EXPECT_EQ(sent_sum, 1024 * 2.5);
  sender.Kill(SIGKILL);

  auto redeemed = client->Redeem(token);
  ASSERT_TRUE(redeemed.ok()) << redeemed.status().ToString();
  const float* data = static_cast<const float*>(redeemed->data());
  EXPECT_EQ(data[0], 2.5f);
  EXPECT_EQ(data[1023], 2.5f);
  EXPECT_EQ(client->Redeem(token).status().code(), StatusCode::kNotFound) << "a token is good once";
  redeemed->Release();
  ASSERT_TRUE(client->Flush().ok());
  EXPECT_EQ(AwaitFootprint(*client, daemon.pid(), baseline), baseline) << FdTargets(daemon.pid());
}

TEST(Crash, AHandOverNobodyRedeemsExpiresAndLeavesNothing) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  const Footprint baseline = StableFootprint(*client, daemon.pid());
  ChildProcess producer(PeerArgs({"produce", daemon.socket(), "ns/lost", "1048576", "1"}));  // 4 MiB
  ASSERT_NE(producer.WaitForLine("published"), "");
  ChildProcess sender(PeerArgs({"hand-over", daemon.socket(), "ns/lost", "300"}));
  const std::string line = sender.WaitForLine("token ");
  ASSERT_NE(line, "");
  sender.Kill(SIGKILL);
  EXPECT_EQ(AwaitFootprint(*client, daemon.pid(), baseline), baseline) << FdTargets(daemon.pid());
  EXPECT_EQ(client->GetStatus()->hand_overs_pending, 0u);
  std::istringstream words(line.substr(6));
  std::string token;
  words >> token;
  EXPECT_EQ(client->Redeem(token).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tensord
