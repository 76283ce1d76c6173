// The level_zero backend on a real Level Zero driver and Intel GPU, between real processes
// through the daemon: the same peers as ze_fake_daemon_test (tensord_ze_peer), with the
// machine's own loader and driver. Label: gpu.
//
// Where there is no Level Zero GPU (CI, and every machine the project has had) every test
// skips, saying what the loader answered. These tests have never run on Intel hardware.
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/test_client.h"
#include "tests/integration/level_zero/ze_test_api.h"

namespace tensord::testing {
namespace {

class ZeGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* alt = std::getenv("ZE_ENABLE_ALT_DRIVERS"); alt != nullptr) {
      GTEST_SKIP() << "ZE_ENABLE_ALT_DRIVERS=" << alt << " names another driver: these tests are for a real GPU";
    }
    ZeProgram program(0);
    if (!program.ok()) {
      GTEST_SKIP() << "no Level Zero GPU here (" << program.error() << " failed): these tests need one";
    }
  }

  static std::string RunPeer(std::vector<std::string> args) {
    args.insert(args.begin(), TENSORD_ZE_PEER);
    return RunToEnd(args);
  }
};

TEST_F(ZeGpuTest, ATensorOutlivesItsProducerAndAnotherProcessReadsIt) {
  DaemonProcess daemon;
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "xpu/w", "0", "1048576"}), "published 0");
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "xpu/w", "1048576", "host"}), "device 14 0|ok");
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "xpu/w", "1048576", "list"}), "device 14 0|early|ok");
}

TEST_F(ZeGpuTest, AConsumersCommandListWaitsForTheProducersWithNoHostWait) {
  DaemonProcess daemon;
  ChildProcess producer({TENSORD_ZE_PEER, "stalled", daemon.socket(), "xpu/s", "0", "1048576"});
  ASSERT_EQ(producer.WaitForLine(""), "published 0");
  ChildProcess consumer({TENSORD_ZE_PEER, "consume", daemon.socket(), "xpu/s", "1048576", "list"});
  EXPECT_EQ(consumer.WaitForLine(""), "device 14 0");
  EXPECT_EQ(consumer.WaitForLine(""), "pending");
  ASSERT_EQ(::kill(producer.pid(), SIGUSR1), 0);
  EXPECT_EQ(producer.WaitForLine(""), "signalled");
  EXPECT_EQ(consumer.WaitForLine(""), "ok");
}

TEST_F(ZeGpuTest, AProducersOwnMemoryIsReadInPlace) {
  DaemonProcess daemon;
  ChildProcess producer({TENSORD_ZE_PEER, "export", daemon.socket(), "xpu/e", "0", "1048576"});
  ASSERT_EQ(producer.WaitForLine(""), "exported 0");
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "xpu/e", "1048576", "host"}), "device 14 0|ok");
}

}  // namespace
}  // namespace tensord::testing
