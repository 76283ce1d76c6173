// The cuda backend through the real daemon and client library, between real processes,
// with libtensord_fake_cuda.so standing in for libcuda (tests/fake_cuda/README.md): device
// memory there is memfds, so this proves the plumbing (allocation, the handle on the fd
// channel, import by UUID, quotas, status, a producer exiting), never the hardware.
#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"

namespace tensord::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class CudaFakeDaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The daemon and every peer inherit these: two fake GPUs.
    ::setenv("TENSORD_LIBCUDA", TENSORD_FAKE_CUDA_PATH, 1);
    ::setenv("TENSORD_FAKE_CUDA_DEVICES", "2", 1);
    ::unsetenv("CUDA_VISIBLE_DEVICES");
  }

  std::unique_ptr<Client> Connect(const DaemonProcess& daemon) {
    ClientOptions options;
    options.socket_path = daemon.socket();
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  // Runs the peer to its end (with CUDA_VISIBLE_DEVICES set when `visible` is given) and
  // returns its stdout lines joined by '|'.
  std::string RunPeer(std::vector<std::string> args, const char* visible = nullptr) {
    args.insert(args.begin(), TENSORD_CUDA_PEER);
    if (visible != nullptr) ::setenv("CUDA_VISIBLE_DEVICES", visible, 1);
    ChildProcess peer(args);
    ::unsetenv("CUDA_VISIBLE_DEVICES");
    std::string out;
    for (std::string line = peer.WaitForLine(""); !line.empty(); line = peer.WaitForLine("")) {
      out += (out.empty() ? "" : "|") + line;
    }
    peer.Wait();
    return out;
  }

  static const BackendInfo* Cuda(const BrokerStatus& status) {
    for (const BackendInfo& backend : status.backends) {
      if (backend.name == "cuda") return &backend;
    }
    return nullptr;
  }
};

TEST_F(CudaFakeDaemonTest, ATensorOnOneGpuOutlivesItsProducerAndIsReadByUuidUnderAnotherOrdinal) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  auto before = client->GetStatus();
  ASSERT_TRUE(before.ok());
  const BackendInfo* cuda = Cuda(*before);
  ASSERT_NE(cuda, nullptr);
  ASSERT_TRUE(cuda->built);
  EXPECT_EQ(cuda->unavailable_reason, "");
  ASSERT_EQ(cuda->devices.size(), 2u);
  const std::string second_gpu = cuda->devices[1].uuid;
  EXPECT_THAT(second_gpu, StartsWith("GPU-"));
  EXPECT_EQ(cuda->devices[1].key, "cuda:" + second_gpu);

  // The producer writes 1000 floats on its GPU 1 and exits.
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "gpu/w", "1", "1000"}), "published 1");
  auto held = client->GetStatus();
  ASSERT_TRUE(held.ok());
  cuda = Cuda(*held);
  ASSERT_NE(cuda, nullptr);
  EXPECT_EQ(cuda->devices[0].bytes_in_use, 0u);
  EXPECT_EQ(cuda->devices[1].bytes_in_use, uint64_t{2} << 20);  // one allocation granule
  EXPECT_EQ(held->host_bytes_in_use, 0u);

  // A consumer that sees only that GPU calls it 0, and reads what the producer wrote.
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "gpu/w", "1000"}, second_gpu.c_str()),
            std::string("device 2 0|ok"));
  // One that sees all of them calls it 1.
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "gpu/w", "1000"}), std::string("device 2 1|ok"));
  // One that cannot see it is told so.
  EXPECT_THAT(RunPeer({"consume", daemon.socket(), "gpu/w", "1000"}, "0"),
              AllOf(StartsWith("error acquire"), HasSubstr("is not visible in this process")));

  // Unbound and unleased, the memory goes back.
  ASSERT_TRUE(client->Delete("gpu/w").ok());
  auto after = client->GetStatus();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(Cuda(*after)->devices[1].bytes_in_use, 0u);
}

TEST_F(CudaFakeDaemonTest, EachGpuHasItsQuota) {
  DaemonProcess daemon({"--max-device-bytes", "cuda:1=1MiB"});
  EXPECT_THAT(RunPeer({"produce", daemon.socket(), "gpu/big", "1", "1000"}),
              AllOf(StartsWith("error allocate: RESOURCE_EXHAUSTED"), HasSubstr("cuda:GPU-"),
                    HasSubstr("--max-device-bytes (cuda:1)")));
  // The other GPU is bounded by its own memory only.
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "gpu/small", "0", "1000"}), "published 0");
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(Cuda(*status)->devices[1].bytes_limit, uint64_t{1} << 20);
  EXPECT_EQ(Cuda(*status)->devices[0].bytes_limit, Cuda(*status)->devices[0].total_bytes);
}

TEST_F(CudaFakeDaemonTest, WithoutADeviceTheBackendSaysWhyAndHostMemoryKeepsWorking) {
  ::setenv("TENSORD_FAKE_CUDA_DEVICES", "0", 1);
  DaemonProcess daemon;
  ::setenv("TENSORD_FAKE_CUDA_DEVICES", "2", 1);
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok());
  const BackendInfo* cuda = Cuda(*status);
  ASSERT_NE(cuda, nullptr);
  EXPECT_THAT(cuda->unavailable_reason, HasSubstr("no CUDA device"));
  EXPECT_TRUE(cuda->devices.empty());
  // The peer sees two GPUs, the daemon none.
  EXPECT_THAT(RunPeer({"produce", daemon.socket(), "gpu/w", "0", "4"}),
              AllOf(StartsWith("error allocate: FAILED_PRECONDITION"), HasSubstr("the cuda backend is unavailable")));
  TensorSpec spec;
  spec.dtype = dtypes::kFloat32;
  spec.shape = {4};
  auto host = client->Allocate("cpu", spec);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_TRUE(client->Publish(*host, "cpu/x").ok());
  EXPECT_TRUE(client->Acquire("cpu/x").ok());
}

}  // namespace
}  // namespace tensord::testing
