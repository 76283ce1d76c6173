// The level_zero backend through the real daemon and client library, between real
// processes, with Debian's real Level Zero loader loading tests/fake_ze's software driver
// (ZE_ENABLE_ALT_DRIVERS): device memory there is memfds and command lists run on host
// threads, so this proves the plumbing (allocation, handles and their fds on the fd
// channel, import by UUID, the ready and done events, opens cached per allocation,
// quotas, status, a producer exiting, the unavailable paths), never an Intel GPU.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/test_client.h"
#include "tests/integration/level_zero/ze_test_api.h"

namespace tensord::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class ZeFakeDaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The daemon and every peer inherit these: two fake devices through the real loader.
    ::setenv("ZE_ENABLE_ALT_DRIVERS", TENSORD_FAKE_ZE_PATH, 1);
    ::setenv("TENSORD_FAKE_ZE_DEVICES", "2", 1);
    ::unsetenv("TENSORD_FAKE_ZE_FAIL_INIT");
    ::unsetenv("TENSORD_LIBZE_LOADER");
  }

  // Runs the peer to its end and returns its stdout lines joined by '|'.
  static std::string RunPeer(std::vector<std::string> args) {
    args.insert(args.begin(), TENSORD_ZE_PEER);
    return RunToEnd(args);
  }

  static const BackendInfo* LevelZero(const BrokerStatus& status) { return FindBackend(status, "level_zero"); }

};

TEST_F(ZeFakeDaemonTest, ATensorOnAnXpuOutlivesItsProducerAndAnotherProcessReadsIt) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  auto before = client->GetStatus();
  ASSERT_TRUE(before.ok());
  const BackendInfo* ze = LevelZero(*before);
  ASSERT_NE(ze, nullptr);
  ASSERT_TRUE(ze->built);
  EXPECT_EQ(ze->unavailable_reason, "");
  ASSERT_EQ(ze->devices.size(), 2u);
  EXPECT_EQ(ze->devices[1].key, "level_zero:" + ze->devices[1].uuid);
  EXPECT_NE(ze->devices[0].uuid, ze->devices[1].uuid);

  // The producer writes 1000 floats on its device 1 through its command list and exits.
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "xpu/w", "1", "1000"}), "published 1");
  auto held = client->GetStatus();
  ASSERT_TRUE(held.ok());
  ze = LevelZero(*held);
  ASSERT_NE(ze, nullptr);
  EXPECT_EQ(ze->devices[0].bytes_in_use, 0u);
  EXPECT_EQ(ze->devices[1].bytes_in_use, uint64_t{64} << 10);  // one 64 KiB granule
  EXPECT_EQ(held->host_bytes_in_use, 0u);

  // Another process opens it by UUID and reads what the producer wrote (DLPack kDLOneAPI).
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "xpu/w", "1000", "host"}), "device 14 1|ok");
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "xpu/w", "1000", "list"}), "device 14 1|early|ok");

  // Unbound and unleased, the memory goes back.
  ASSERT_TRUE(client->Delete("xpu/w").ok());
  auto after = client->GetStatus();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(LevelZero(*after)->devices[1].bytes_in_use, 0u);
}

// The producer's copy in waits behind an event only it signals later, and it publishes
// naming its command list: a consumer's command list waits for that work on the "device"
// (nothing has run 300 ms later), and one with no list waits on the host.
TEST_F(ZeFakeDaemonTest, AConsumerWaitsForTheProducersCommandListNotJustThePublish) {
  DaemonProcess daemon;
  ChildProcess producer({TENSORD_ZE_PEER, "stalled", daemon.socket(), "xpu/s", "0", "1000"});
  ASSERT_EQ(producer.WaitForLine(""), "published 0");

  ChildProcess on_list({TENSORD_ZE_PEER, "consume", daemon.socket(), "xpu/s", "1000", "list"});
  EXPECT_EQ(on_list.WaitForLine(""), "device 14 0");  // the acquire did not block
  EXPECT_EQ(on_list.WaitForLine(""), "pending");      // its copy waits for the producer's
  ChildProcess on_host({TENSORD_ZE_PEER, "consume", daemon.socket(), "xpu/s", "1000", "host"});
  EXPECT_EQ(on_host.WaitForLine("", std::chrono::milliseconds(500)), "");  // blocked in acquire

  ASSERT_EQ(::kill(producer.pid(), SIGUSR1), 0);
  EXPECT_EQ(producer.WaitForLine(""), "signalled");
  EXPECT_EQ(on_list.WaitForLine(""), "ok");
  EXPECT_EQ(on_host.WaitForLine(""), "device 14 0");
  EXPECT_EQ(on_host.WaitForLine(""), "ok");
}

// A consumer lets go while its command list still has to read the tensor: the release
// reaches the broker only once that work has run (its done event).
TEST_F(ZeFakeDaemonTest, AReleaseWaitsForTheConsumersCommandList) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "xpu/r", "0", "1000"}), "published 0");
  auto stat = client->Stat("xpu/r");
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  const uint64_t id = stat->info.tensor_id;

  ChildProcess consumer({TENSORD_ZE_PEER, "ordered", daemon.socket(), "xpu/r", "1000"});
  ASSERT_EQ(consumer.WaitForLine(""), "released");
  // "released" comes after the peer's Flush, which returns once the broker has every
  // release the peer sent: a release not held back would be gone already, so the lease
  // still held here is the proof, with no sleep. The window after it covers the sender's
  // later ticks (every 200 us while a view waits), which must keep holding it too.
  const auto window_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  do {
    auto held = client->Stat(TensorId{id});
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    ASSERT_EQ(held->holders.size(), 1u) << "the lease went before the consumer's copy ran";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (std::chrono::steady_clock::now() < window_end);
  ASSERT_EQ(::kill(consumer.pid(), SIGUSR1), 0);
  EXPECT_EQ(consumer.WaitForLine(""), "signalled");
  EXPECT_TRUE(WaitForHolders(*client, id, 0, std::chrono::seconds(10)))
      << "the release did not follow the copy it waited for";
}

// A producer's own device memory (zeMemAllocDevice, the tensor inside the block),
// exported by pointer with its fd on the fd channel: a consumer reads it at the right
// offset; the producer's kill -9 retires it.
TEST_F(ZeFakeDaemonTest, AProducersOwnMemoryIsReadInPlaceAndRetiresWhenTheProducerIsKilled) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  ChildProcess producer({TENSORD_ZE_PEER, "export", daemon.socket(), "xpu/e", "1", "1000"});
  ASSERT_EQ(producer.WaitForLine(""), "exported 1");
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "xpu/e", "1000", "host"}), "device 14 1|ok");

  auto stat = client->Stat("xpu/e");
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  const uint64_t id = stat->info.tensor_id;
  producer.Kill(SIGKILL);
  Result<TensorStat> retired = WaitUntilRetired(*client, id);
  // Unleased, a retired tensor may be gone at once.
  if (retired.ok()) {
    EXPECT_EQ(retired->info.state, TensorState::kRetired);
  }
  EXPECT_THAT(RunPeer({"consume", daemon.socket(), "xpu/e", "1000", "host"}),
              AllOf(StartsWith("error acquire: NOT_FOUND"), HasSubstr("xpu/e")));
  auto after = client->GetStatus();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->tensors, 0u);
}

// One allocation is opened once per process, however many leases and views; the open
// is closed when the last one goes.
TEST_F(ZeFakeDaemonTest, AProcessOpensAnAllocationOnceAndClosesItWithItsLastLease) {
  DaemonProcess daemon;
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "xpu/o", "0", "1000"}), "published 0");
  EXPECT_EQ(RunPeer({"opens", daemon.socket(), "xpu/o", "1000"}), "opens 1|opens 0");
}

// Two tensors exported from one block are two buffers over one allocation: a consumer
// opens the allocation once and each buffer's ready-event pool on its own.
TEST_F(ZeFakeDaemonTest, TwoExportsFromOneBlockShareTheOpenOfTheirAllocation) {
  DaemonProcess daemon;
  ChildProcess producer({TENSORD_ZE_PEER, "export2", daemon.socket(), "xpu/p", "0", "1000"});
  ASSERT_EQ(producer.WaitForLine(""), "exported 0");
  EXPECT_EQ(RunPeer({"pair", daemon.socket(), "xpu/p", "1000"}), "pair ok ok|opens 1");
}

TEST_F(ZeFakeDaemonTest, EachDeviceHasItsQuota) {
  DaemonProcess daemon({"--max-device-bytes", "level_zero:1=32KiB"});
  EXPECT_THAT(RunPeer({"produce", daemon.socket(), "xpu/big", "1", "1000"}),
              AllOf(StartsWith("error allocate: RESOURCE_EXHAUSTED"), HasSubstr("level_zero:"),
                    HasSubstr("--max-device-bytes (level_zero:1)")));
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "xpu/small", "0", "1000"}), "published 0");
}

TEST_F(ZeFakeDaemonTest, WithoutADeviceTheBackendSaysWhyAndHostMemoryKeepsWorking) {
  ::setenv("TENSORD_FAKE_ZE_DEVICES", "0", 1);
  DaemonProcess daemon;
  ::setenv("TENSORD_FAKE_ZE_DEVICES", "2", 1);
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok());
  const BackendInfo* ze = LevelZero(*status);
  ASSERT_NE(ze, nullptr);
  EXPECT_THAT(ze->unavailable_reason, HasSubstr("no Level Zero device"));
  EXPECT_TRUE(ze->devices.empty());
  // The peer sees two devices, the daemon none.
  EXPECT_THAT(RunPeer({"produce", daemon.socket(), "xpu/w", "0", "4"}),
              AllOf(StartsWith("error allocate: FAILED_PRECONDITION"),
                    HasSubstr("the level_zero backend is unavailable")));
  TensorSpec spec;
  spec.dtype = dtypes::kFloat32;
  spec.shape = {4};
  auto host = client->Allocate("cpu", spec);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_TRUE(client->Publish(*host, "cpu/x").ok());
  EXPECT_TRUE(client->Acquire("cpu/x").ok());
}

TEST_F(ZeFakeDaemonTest, WithoutALoaderOrWithADriverThatFailsTheBackendSaysWhich) {
  ::setenv("TENSORD_LIBZE_LOADER", "/nonexistent/libze_loader.so.1", 1);
  DaemonProcess no_loader;
  ::unsetenv("TENSORD_LIBZE_LOADER");
  ::setenv("TENSORD_FAKE_ZE_FAIL_INIT", "1", 1);
  DaemonProcess failing_driver;
  ::unsetenv("TENSORD_FAKE_ZE_FAIL_INIT");
  auto first = Connect(no_loader);
  auto second = Connect(failing_driver);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  auto a = first->GetStatus();
  auto b = second->GetStatus();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_NE(LevelZero(*a), nullptr);
  ASSERT_NE(LevelZero(*b), nullptr);
  EXPECT_THAT(LevelZero(*a)->unavailable_reason,
              AllOf(HasSubstr("/nonexistent/libze_loader.so.1 not found"), HasSubstr("no Level Zero loader")));
  EXPECT_THAT(LevelZero(*b)->unavailable_reason, HasSubstr("zeInit"));
}

// A program hands tensord its own context before its first Level Zero tensor (every peer
// does: the fake refuses a command list that uses memory or events of another context, so
// their copies prove it was taken); after one, it is told why it is too late.
TEST_F(ZeFakeDaemonTest, AProgramsContextIsRefusedAfterTheFirstImport) {
  DaemonProcess daemon;
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "xpu/c", "0", "16"}), "published 0");
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  auto tensor = client->Acquire("xpu/c");  // in a context tensord makes itself
  ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
  ZeProgram program(0);
  ASSERT_TRUE(program.ok()) << program.error();
  Status late = UseLevelZeroContext(program.driver(), program.context());
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(), HasSubstr("before the first Level Zero tensor"));
  EXPECT_EQ(UseLevelZeroContext(nullptr, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tensord::testing
