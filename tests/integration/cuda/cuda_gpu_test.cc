// The cuda backend on a real NVIDIA driver and GPU, between real processes through the
// daemon: a device tensor shared by two processes, a producer that exits before its
// consumer reads, stream order with no host sync between the producer's work and the
// consumer's read, a release held until the consumer's stream is done (both with the
// producer's or consumer's stream held shut by a gate the test opens, so that the order is
// shown, not timed), a recycled device buffer and the consumer's kept mapping of it, a
// producer's own memory exported by pointer (and retired when the producer is killed), and
// pinned host views that stay registered across a recycled buffer. Label: gpu.
//
// Where there is no driver or no GPU (CI) every test skips, saying why.
// docs/memory-backends.md and docs/gpu-runs/ say which ran on which GPU.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/cuda/driver_calls.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/test_client.h"

namespace tensord::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr unsigned kStreamNonBlocking = DriverCalls::kStreamNonBlocking;  // no implicit sync
constexpr size_t kScratchWords = size_t{16} << 20;  // 64 MiB of 32-bit words: room for DeviceReads

// A word of device memory that holds streams shut: work queued on a stream after Hold()
// waits (cuStreamWaitValue32) until Open() writes the word from a stream of its own. What
// the tests use instead of queueing "enough" work and hoping it is still running.
class Gate {
 public:
  explicit Gate(const DriverCalls& d) : d_(d) {
    ok_ = d_.alloc(&word_, 4) == 0 && d_.stream_create(&opener_, DriverCalls::kStreamNonBlocking) == 0 &&
          Write(0);
  }
  ~Gate() {
    if (word_ == 0) return;
    Open();  // nothing stays held on memory about to be freed, also after a failed assertion
    d_.free(word_);
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  bool ok() const { return ok_; }
  // Work queued on `stream` from now on waits for Open().
  bool Hold(void* stream) const { return d_.wait_value32(stream, word_, 1, 0 /* CU_STREAM_WAIT_VALUE_GEQ */) == 0; }
  bool Open() const { return Write(1); }

 private:
  bool Write(unsigned value) const {
    return d_.memset_async(word_, value, 1, opener_) == 0 && d_.stream_synchronize(opener_) == 0;
  }
  const DriverCalls& d_;
  uint64_t word_ = 0;
  void* opener_ = nullptr;
  bool ok_ = false;
};

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

  // Whether host float32[count] at `host` holds i * 0.5 + shift, read on the GPU: copied
  // into device scratch and back (from a pinned view, the driver's DMA reads it in place).
  bool DeviceReads(const void* host, int64_t count, float shift) {
    const size_t bytes = static_cast<size_t>(count) * 4;
    std::vector<float> back(static_cast<size_t>(count), -1.0f);
    if (d().copy_in(scratch_, host, bytes) != 0 || d().copy_out(back.data(), scratch_, bytes) != 0) return false;
    for (int64_t i = 0; i < count; ++i) {
      if (back[static_cast<size_t>(i)] != static_cast<float>(i) * 0.5f + shift) return false;
    }
    return true;
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

// The producer's stream is held shut by a gate (cuStreamWaitValue32 on a word only the test
// writes) ahead of the copy that fills the tensor, and stays shut until the consumer, in
// another process, has queued its read: a consumer that did not wait on the ready event
// would read the zeros written before. Each precondition is checked, not assumed: the
// producer's stream is still pending after the publish and again once the consumer has
// queued its read, and the consumer's own stream is pending then too.
TEST_F(CudaGpuTest, TheConsumerReadsWhatTheProducersStreamWroteWithNoHostSyncBetween) {
  if (d().wait_value32 == nullptr || d().stream_query == nullptr) {
    GTEST_SKIP() << d().library << " lacks cuStreamWaitValue32_v2 or cuStreamQuery: the gate needs them";
  }
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  constexpr int64_t kCount = 1 << 20;
  const uint64_t source = Halves(kCount);
  ASSERT_NE(source, 0u);
  Gate gate(d());
  ASSERT_TRUE(gate.ok());
  void* stream = nullptr;
  ASSERT_EQ(d().stream_create(&stream, kStreamNonBlocking), 0);
  TensorSpec spec;
  spec.dtype = dtypes::kFloat32;
  spec.shape = {kCount};
  spec.device = DLDevice{kDLCUDA, 0};
  auto tensor = producer->Allocate("gpu", spec);
  ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
  // Zeros first, finished: what a read that does not wait would see.
  ASSERT_EQ(d().memset_async(reinterpret_cast<uintptr_t>(tensor->mutable_data()), 0, kCount, stream), 0);
  ASSERT_EQ(d().stream_synchronize(stream), 0);
  ASSERT_TRUE(gate.Hold(stream));
  ASSERT_TRUE(tensor->CopyFromDevice(reinterpret_cast<const void*>(source), kCount * 4,
                                     reinterpret_cast<uintptr_t>(stream)).ok());
  PublishOptions publish;
  publish.stream = reinterpret_cast<uintptr_t>(stream);
  ASSERT_TRUE(producer->Publish(*tensor, "gpu/o", publish).ok());
  ASSERT_EQ(d().stream_query(stream), DriverCalls::kNotReady) << "the gate did not hold the producer's stream";

  ChildProcess consumer({TENSORD_CUDA_PEER, "gated", daemon.socket(), "gpu/o", std::to_string(kCount)});
  const std::string queued = consumer.WaitForLine("queued", std::chrono::seconds(60));
  EXPECT_EQ(d().stream_query(stream), DriverCalls::kNotReady)
      << "the producer's stream finished before the consumer queued its read: the test shows nothing";
  EXPECT_EQ(queued, "queued pending 1") << "the consumer's stream was not waiting for the producer's";
  // Open the gate: the copy runs, then the ready event, then the consumer's read.
  ASSERT_TRUE(gate.Open());
  EXPECT_EQ(consumer.WaitForLine("device", std::chrono::seconds(60)), "device 2 0");
  EXPECT_EQ(consumer.WaitForLine("", std::chrono::seconds(60)), "ok");
  EXPECT_EQ(d().stream_synchronize(stream), 0);
  d().free(source);
}

// A producer's next tensor of the same size in the same namespace lands in the buffer of
// the last one, once the consumer (another process) has let it go, and the consumer finds
// its mapping of it kept: the same buffer and the same device address every time.
TEST_F(CudaGpuTest, ARecycledBufferComesBackToTheProducerAndTheConsumerKeepsItsMapping) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  constexpr int64_t kCount = 1 << 20;
  constexpr int kItems = 5;
  ChildProcess consumer({TENSORD_CUDA_PEER, "take-loop", daemon.socket(), "rc/", std::to_string(kCount),
                         std::to_string(kItems)});
  std::vector<float> values(kCount);
  std::vector<std::string> lines;
  const void* producer_view = nullptr;
  for (int k = 0; k < kItems; ++k) {
    {
      TensorSpec spec;
      spec.dtype = dtypes::kFloat32;
      spec.shape = {kCount};
      spec.device = DLDevice{kDLCUDA, 0};
      auto tensor = producer->Allocate("rc", spec);
      ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
      if (k == 0) producer_view = tensor->data();
      EXPECT_EQ(tensor->data(), producer_view) << "item " << k << ": the producer's buffer was mapped again";
      for (int64_t i = 0; i < kCount; ++i) {
        values[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f + static_cast<float>(k);
      }
      ASSERT_EQ(d().copy_in(reinterpret_cast<uintptr_t>(tensor->mutable_data()), values.data(), kCount * 4), 0);
      ASSERT_TRUE(producer->Publish(*tensor, "rc/" + std::to_string(k)).ok());
    }
    ASSERT_TRUE(producer->Flush().ok());  // the producer's own lease is gone before the consumer's
    lines.push_back(consumer.WaitForLine("took", std::chrono::seconds(60)));
  }
  // "took K buffer B at P ok": B and P the same for every item.
  ASSERT_THAT(lines[0], ::testing::EndsWith(" ok"));
  const std::string first = lines[0].substr(lines[0].find(" buffer "));
  for (int k = 0; k < kItems; ++k) {
    EXPECT_EQ(lines[static_cast<size_t>(k)], "took " + std::to_string(k) + first) << "item " << k;
  }
}

// The consumer's "kernel" (work queued after a gate only the test opens) is still pending
// when it lets go: the lease stays until the gate opens and the work is through.
TEST_F(CudaGpuTest, AReleaseWaitsForTheConsumersStream) {
  if (d().wait_value32 == nullptr || d().stream_query == nullptr) {
    GTEST_SKIP() << d().library << " lacks cuStreamWaitValue32_v2 or cuStreamQuery: the gate needs them";
  }
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
  Gate gate(d());
  ASSERT_TRUE(gate.ok());
  void* stream = nullptr;
  ASSERT_EQ(d().stream_create(&stream, kStreamNonBlocking), 0);
  AcquireOptions acquire;
  acquire.stream = reinterpret_cast<uintptr_t>(stream);
  {
    auto held = client->Acquire("gpu/d", acquire);
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    ASSERT_TRUE(gate.Hold(stream));
    ASSERT_EQ(d().memset_async(reinterpret_cast<uintptr_t>(held->data()), 7, 1024, stream), 0);
  }
  ASSERT_TRUE(client->Flush().ok());
  ASSERT_EQ(d().stream_query(stream), DriverCalls::kNotReady) << "the consumer's work is not pending: the test shows nothing";
  auto stat = client->Stat(TensorId{tensor_id});
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  EXPECT_EQ(stat->holders.size(), 1u) << "the lease went before the consumer's stream finished";
  ASSERT_TRUE(gate.Open());
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

// A producer's own cuMemAlloc'ed memory (the tensor inside a bigger block), exported by
// pointer with legacy CUDA IPC: another process reads it at the right offset; the
// producer's kill -9 retires it, and a new acquire says why.
TEST_F(CudaGpuTest, AProducersOwnMemoryIsReadInPlaceAndRetiresWhenTheProducerIsKilled) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  constexpr int64_t kCount = 1000000;
  ChildProcess producer({TENSORD_CUDA_PEER, "export", daemon.socket(), "gpu/e", "0", std::to_string(kCount)});
  ASSERT_EQ(producer.WaitForLine(""), "exported 0");
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "gpu/e", std::to_string(kCount)}), "device 2 0|ok");

  // This process holds a lease across the producer's death (by id: no name to cache).
  auto stat = client->Stat("gpu/e");
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  const uint64_t id = stat->info.tensor_id;
  auto held = client->Acquire(TensorId{id});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  const pid_t producer_pid = producer.pid();
  producer.Kill(SIGKILL);
  Result<TensorStat> retired = WaitUntilRetired(*client, id);
  ASSERT_TRUE(retired.ok()) << retired.status().ToString();
  EXPECT_EQ(retired->info.state, TensorState::kRetired);
  auto again = client->Acquire(TensorId{id});
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), AllOf(HasSubstr("its producer (pid " + std::to_string(producer_pid)),
                                              HasSubstr("exited")));
  held->Release();
  ASSERT_TRUE(client->Flush().ok());
  EXPECT_EQ(client->Acquire("gpu/e").status().code(), StatusCode::kNotFound);
}

// A host tensor taken pinned is memory the driver knows as pinned, read in place by a
// host-to-device copy; when its recycled buffer carries the producer's next tensor, that
// tensor's pinned view is the same registered mapping: pinning is paid once per buffer.
TEST_F(CudaGpuTest, APinnedTakeIsRegisteredHostMemoryAndStaysSoWhenItsBufferIsRecycled) {
  DaemonProcess daemon;
  ClientOptions options;
  options.socket_path = daemon.socket();
  options.lease_cache = false;
  options.lease_cache_linger = std::chrono::seconds(30);  // keeps a recycled buffer's view
  auto connected = Client::Connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  Client& client = **connected;
  constexpr int64_t kCount = 1 << 20;  // 4 MiB: a dedicated, recyclable buffer
  auto produce = [&](const std::string& name, float shift) -> uint64_t {
    TensorSpec spec;
    spec.shape = {kCount};
    auto tensor = client.Allocate("pin", spec);
    EXPECT_TRUE(tensor.ok()) << tensor.status().ToString();
    if (!tensor.ok()) return 0;
    auto* values = static_cast<float*>(tensor->mutable_data());
    for (int64_t i = 0; i < kCount; ++i) values[i] = static_cast<float>(i) * 0.5f + shift;
    auto published = client.Publish(*tensor, name);
    EXPECT_TRUE(published.ok()) << published.status().ToString();
    return published.ok() ? tensor->info().buffer_id : 0;
  };
  std::vector<float> pageable(1024);
  ASSERT_FALSE(d().IsPinnedHost(pageable.data())) << "the pinned check cannot tell pageable memory apart";

  TakeOptions pinned;
  pinned.pinned = true;
  const uint64_t first_buffer = produce("pin/r0", 0.0f);
  ASSERT_NE(first_buffer, 0u);
  const void* first_view = nullptr;
  {
    auto view = client.Take("pin/r0", pinned);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    EXPECT_EQ(view->info().device.device_type, kDLCUDAHost);
    EXPECT_TRUE(d().IsPinnedHost(view->data()));
    EXPECT_TRUE(DeviceReads(view->data(), kCount, 0.0f));
    first_view = view->data();
  }
  ASSERT_TRUE(client.Flush().ok());
  // The broker pools the buffer once the release is in: the next allocation gets it back.
  uint64_t second_buffer = 0;
  for (int i = 0; i < 200 && second_buffer != first_buffer; ++i) {
    second_buffer = produce("pin/r1", 1.0f);
    ASSERT_NE(second_buffer, 0u);
    if (second_buffer != first_buffer) {
      ASSERT_TRUE(client.Delete("pin/r1").ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ASSERT_EQ(second_buffer, first_buffer) << "the buffer was not recycled";
  auto view = client.Take("pin/r1", pinned);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->data(), first_view) << "the recycled buffer's pinned view was mapped again";
  EXPECT_TRUE(d().IsPinnedHost(view->data()));
  EXPECT_TRUE(DeviceReads(view->data(), kCount, 1.0f));
}

}  // namespace
}  // namespace tensord::testing
