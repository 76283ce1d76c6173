// The cuda backend through the real daemon and client library, between real processes,
// with libtensord_fake_cuda.so standing in for libcuda (tests/fake_cuda/README.md): device
// memory there is memfds, so this proves the plumbing (allocation, the handle on the fd
// channel, import by UUID, quotas, status, a producer exiting), never the hardware.
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

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

// A producer's own CUDA memory (cuMemAlloc, the tensor inside the block), exported by
// pointer: a consumer reads it at the right offset under its own ordinal; the producer's
// kill -9 retires it, and new acquires say why.
TEST_F(CudaFakeDaemonTest, AProducersOwnMemoryIsReadInPlaceAndRetiresWhenTheProducerIsKilled) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok());
  ASSERT_NE(Cuda(*status), nullptr);
  ASSERT_EQ(Cuda(*status)->devices.size(), 2u);
  const std::string second_gpu = Cuda(*status)->devices[1].uuid;

  ChildProcess producer({TENSORD_CUDA_PEER, "export", daemon.socket(), "gpu/e", "1", "1000"});
  ASSERT_EQ(producer.WaitForLine(""), "exported 1");
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "gpu/e", "1000"}, second_gpu.c_str()),
            std::string("device 2 0|ok"));
  EXPECT_EQ(RunPeer({"consume", daemon.socket(), "gpu/e", "1000"}), std::string("device 2 1|ok"));

  // This process holds a lease across the producer's death (by id: no name to cache).
  auto stat = client->Stat("gpu/e");
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  const uint64_t id = stat->info.tensor_id;
  auto held = client->Acquire(TensorId{id});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held->info().device.device_id, 1);
  const pid_t producer_pid = producer.pid();
  producer.Kill(SIGKILL);

  // The daemon hears the fd channel close on its own time.
  Result<TensorStat> retired = client->Stat(TensorId{id});
  for (int i = 0; i < 500 && retired.ok() && retired->info.state != TensorState::kRetired; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    retired = client->Stat(TensorId{id});
  }
  ASSERT_TRUE(retired.ok()) << retired.status().ToString();
  EXPECT_EQ(retired->info.state, TensorState::kRetired);
  EXPECT_EQ(client->Acquire("gpu/e").status().code(), StatusCode::kNotFound);
  auto again = client->Acquire(TensorId{id});
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(),
              AllOf(HasSubstr("tensor " + std::to_string(id) + ": its producer (pid " + std::to_string(producer_pid)),
                    HasSubstr("exited; its memory was the producer's")));
  EXPECT_THAT(RunPeer({"consume", daemon.socket(), "gpu/e", "1000"}),
              AllOf(StartsWith("error acquire: NOT_FOUND"), HasSubstr("gpu/e")));

  // The last lease gone, nothing of it is left.
  held->Release();
  ASSERT_TRUE(client->Flush().ok());
  auto after = client->GetStatus();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->tensors, 0u);
  EXPECT_EQ(Cuda(*after)->devices[1].bytes_in_use, 0u);
}

TEST_F(CudaFakeDaemonTest, ExportDeviceRefusesHostMemoryAndPointersTheDriverDoesNotKnow) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  std::vector<float> host(16, 1.0f);
  TensorSpec spec;
  spec.dtype = dtypes::kFloat32;
  spec.shape = {16};
  auto on_cpu = client->ExportDevice(host.data(), "cpu", spec);
  EXPECT_EQ(on_cpu.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(on_cpu.status().message(), AllOf(HasSubstr("host memory is not exported by pointer"),
                                                HasSubstr("Client::Export")));
  spec.device = DLDevice{kDLCUDA, 0};
  auto not_device_memory = client->ExportDevice(host.data(), "gpu", spec);
  EXPECT_EQ(not_device_memory.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(not_device_memory.status().message(), HasSubstr("not CUDA device memory"));
  auto list = client->List("");
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
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

// Host float32[count] tensors with element i = i * 0.5, published by this process.
void PublishHalves(Client& client, const std::string& name, int64_t count, bool isolated) {
  TensorSpec spec;
  spec.dtype = dtypes::kFloat32;
  spec.shape = {count};
  spec.isolated = isolated;
  auto tensor = client.Allocate(name.substr(0, name.find('/')), spec);
  ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
  auto* values = static_cast<float*>(tensor->mutable_data());
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<float>(i) * 0.5f;
  ASSERT_TRUE(client.Publish(*tensor, name).ok());
}

// A consumer acquires host tensors pinned: kDLCUDAHost, read-only, the same bytes, one
// cuMemHostRegister per mapped buffer (an arena's tensors share one), gone once it lets go.
TEST_F(CudaFakeDaemonTest, AConsumerPinsEachHostBufferOnceAndUnpinsItWhenItLetsGo) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  PublishHalves(*client, "cpu/big", 300000, /*isolated=*/true);
  PublishHalves(*client, "cpu/a", 1000, /*isolated=*/false);
  PublishHalves(*client, "cpu/b", 1000, /*isolated=*/false);
  auto a = client->Stat("cpu/a");
  auto b = client->Stat("cpu/b");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->info.arena);
  ASSERT_EQ(a->info.buffer_id, b->info.buffer_id);  // one arena holds both

  EXPECT_EQ(RunPeer({"pinned", daemon.socket(), "300000", "cpu/big"}),
            "device 3 0 readonly 1|values ok|registered 1|registered 0|plain device 1|plain ok");
  EXPECT_EQ(RunPeer({"pinned", daemon.socket(), "1000", "cpu/a", "cpu/b"}),
            "device 3 0 readonly 1|values ok|device 3 0 readonly 1|values ok|registered 1|registered 0|"
            "plain device 1|plain ok");
}

TEST_F(CudaFakeDaemonTest, APinnedAcquireOfGpuMemoryIsRefusedNamingTheTensor) {
  DaemonProcess daemon;
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "gpu/w", "0", "1000"}), "published 0");
  EXPECT_THAT(RunPeer({"pinned", daemon.socket(), "1000", "gpu/w"}),
              AllOf(StartsWith("error pinned: INVALID_ARGUMENT"), HasSubstr("'gpu/w'"),
                    HasSubstr("a pinned view is of host memory, and this is DEVICE_TYPE_CUDA memory"),
                    HasSubstr("|plain device 2")));
}

// A client without a CUDA driver: a pinned acquire says why; plain host acquires work.
TEST_F(CudaFakeDaemonTest, WithoutADriverAPinnedAcquireSaysWhyAndPlainOnesWork) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  PublishHalves(*client, "cpu/x", 1000, /*isolated=*/true);
  ::setenv("TENSORD_LIBCUDA", "/nonexistent/libcuda-missing.so.1", 1);
  const std::string out = RunPeer({"pinned", daemon.socket(), "1000", "cpu/x"});
  ::setenv("TENSORD_LIBCUDA", TENSORD_FAKE_CUDA_PATH, 1);
  // The peer's log says once that the driver is unavailable; then the acquire says why.
  EXPECT_THAT(out, AllOf(HasSubstr("|error pinned: UNAVAILABLE"), HasSubstr("'cpu/x'"),
                         HasSubstr("a pinned view needs the cuda driver: /nonexistent/libcuda-missing.so.1 not found"),
                         HasSubstr("no NVIDIA driver on this machine"), HasSubstr("|plain device 1|plain ok")));
}

}  // namespace
}  // namespace tensord::testing
