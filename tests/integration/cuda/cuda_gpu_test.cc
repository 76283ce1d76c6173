// The cuda backend on a real NVIDIA driver and GPU, between real processes through the
// daemon: a device tensor shared by two processes, a producer that exits before its
// consumer reads, stream order with no host sync between the producer's work and the
// consumer's read, and a release held until the consumer's stream is done. Label: gpu.
//
// Where there is no driver or no GPU (CI) every test skips, saying why. These tests have
// not run on hardware yet (docs/memory-backends.md says what has).
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
#include "tests/cuda/driver_calls.h"
#include "tests/integration/daemon_fixture.h"

namespace tensord::testing {
namespace {

constexpr unsigned kStreamNonBlocking = DriverCalls::kStreamNonBlocking;  // no implicit sync
constexpr size_t kScratchWords = size_t{256} << 20;  // 1 GiB of 32-bit words

class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* fake = std::getenv("TENSORD_LIBCUDA"); fake != nullptr) {
      GTEST_SKIP() << "TENSORD_LIBCUDA=" << fake << " names a stand-in: these tests are for a real GPU";
    }
    if (!d().why_not.empty()) GTEST_SKIP() << "no CUDA GPU here (" << d().why_not << "): these tests need one";
    ASSERT_TRUE(d().MakeCurrent(0));
    ASSERT_EQ(d().alloc(&scratch_, kScratchWords * 4), 0);
  }
  void TearDown() override {
    if (scratch_ != 0) d().free(scratch_);
  }
  static const DriverCalls& d() { return DriverCalls::Get(); }

  // About half a second of GPU work on `stream` that touches no tensor: whatever is queued
  // after it runs late, so a missing wait would show.
  void Busy(void* stream) {
    for (int i = 0; i < 200; ++i) ASSERT_EQ(d().memset_async(scratch_, static_cast<unsigned>(i), kScratchWords, stream), 0);
  }

  std::string RunPeer(std::vector<std::string> args) {
    args.insert(args.begin(), TENSORD_CUDA_PEER);
    return RunToEnd(args);
  }

  std::unique_ptr<Client> Connect(const DaemonProcess& daemon) {
    ClientOptions options;
    options.socket_path = daemon.socket();
    options.lease_cache = false;  // releases go when the last reference does
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  uint64_t scratch_ = 0;
};

// float32[count], element i = i * 0.5, in cuMemAlloc'ed memory (what `consume` checks).
uint64_t Halves(int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f;
  uint64_t block = 0;
  if (DriverCalls::Get().alloc(&block, values.size() * 4) != 0) return 0;
  if (DriverCalls::Get().copy_in(block, values.data(), values.size() * 4) != 0) return 0;
  return block;
}

TEST_F(CudaGpuTest, AProducersTensorOutlivesItAndIsReadByAnotherProcess) {
  DaemonProcess daemon;
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "gpu/w", "0", "1000000"}), "published 0");
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "gpu/w", "1000000"}), "device 2 0|ok");
}

TEST_F(CudaGpuTest, TheConsumerReadsWhatTheProducersStreamWroteWithNoHostSyncBetween) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  constexpr int64_t kCount = 1 << 20;
  const uint64_t source = Halves(kCount);
  ASSERT_NE(source, 0u);
  void* stream = nullptr;
  ASSERT_EQ(d().stream_create(&stream, kStreamNonBlocking), 0);
  TensorSpec spec;
  spec.dtype = dtypes::kFloat32;
  spec.shape = {kCount};
  spec.device = DLDevice{kDLCUDA, 0};
  auto tensor = producer->Allocate("gpu", spec);
  ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
  Busy(stream);
  ASSERT_TRUE(tensor->CopyFromDevice(reinterpret_cast<const void*>(source), kCount * 4,
                                     reinterpret_cast<uintptr_t>(stream)).ok());
  PublishOptions publish;
  publish.stream = reinterpret_cast<uintptr_t>(stream);
  ASSERT_TRUE(producer->Publish(*tensor, "gpu/o", publish).ok());
  // No synchronize: the consumer's stream waits on the ready event.
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "gpu/o", std::to_string(kCount)}), "device 2 0|ok");
  EXPECT_EQ(d().stream_synchronize(stream), 0);
  d().free(source);
}

TEST_F(CudaGpuTest, AReleaseWaitsForTheConsumersStream) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  TensorSpec spec;
  spec.dtype = dtypes::kFloat32;
  spec.shape = {1024};
  spec.device = DLDevice{kDLCUDA, 0};
  uint64_t tensor_id = 0;
  {
    auto tensor = client->Allocate("gpu", spec);
    ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
    auto published = client->Publish(*tensor, "gpu/d");
    ASSERT_TRUE(published.ok()) << published.status().ToString();
    tensor_id = published->tensor_id;
  }
  void* stream = nullptr;
  ASSERT_EQ(d().stream_create(&stream, kStreamNonBlocking), 0);
  AcquireOptions acquire;
  acquire.stream = reinterpret_cast<uintptr_t>(stream);
  {
    auto held = client->Acquire("gpu/d", acquire);
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    Busy(stream);  // the "kernel" still running when the consumer lets go
  }
  ASSERT_TRUE(client->Flush().ok());
  auto stat = client->Stat(TensorId{tensor_id});
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  EXPECT_EQ(stat->holders.size(), 1u) << "the lease went before the consumer's stream finished";
  ASSERT_EQ(d().stream_synchronize(stream), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    stat = client->Stat(TensorId{tensor_id});
    ASSERT_TRUE(stat.ok()) << stat.status().ToString();
    if (stat->holders.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(stat->holders.empty());
}

}  // namespace
}  // namespace tensord::testing
