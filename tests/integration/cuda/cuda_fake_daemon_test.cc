// The cuda backend through the real daemon and client library, between real processes,
// with libtensord_fake_cuda.so standing in for libcuda (tests/fake_cuda/README.md): device
// memory there is memfds, so this proves the plumbing (allocation, the handle on the fd
// channel, import by UUID, quotas, status, a producer exiting), never the hardware.
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
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

namespace tensord::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The fake driver as the client loaded it (TENSORD_LIBCUDA), for what this process does
// with its own device memory, as a program with a torch tensor has done before tensord.
void* FakeDriver(const char* symbol) {
  static void* library = ::dlopen(TENSORD_FAKE_CUDA_PATH, RTLD_NOW | RTLD_LOCAL);
  return library == nullptr ? nullptr : ::dlsym(library, symbol);
}

// Makes device `ordinal`'s primary context current on this thread (pushed), cuInit first,
// as a program with CUDA memory of its own has it.
bool PushFakePrimaryContext(int ordinal) {
  using Init = int (*)(unsigned);
  using Retain = int (*)(void**, int);
  using Push = int (*)(void*);
  auto init = reinterpret_cast<Init>(FakeDriver("cuInit"));
  auto retain = reinterpret_cast<Retain>(FakeDriver("cuDevicePrimaryCtxRetain"));
  auto push = reinterpret_cast<Push>(FakeDriver("cuCtxPushCurrent_v2"));
  void* context = nullptr;
  return init != nullptr && retain != nullptr && push != nullptr && init(0) == 0 && retain(&context, ordinal) == 0 &&
         push(context) == 0;
}

// float32[count] (element i is i * 0.5) in a cuMemAlloc'ed block of device `ordinal`, in
// its primary context, made current on the constructing thread; freed there too.
class OwnDeviceMemory {
 public:
  OwnDeviceMemory(int ordinal, int64_t count) : bytes_(static_cast<size_t>(count) * sizeof(float)) {
    using Alloc = int (*)(uint64_t*, size_t);
    using CopyIn = int (*)(uint64_t, const void*, size_t);
    auto alloc = reinterpret_cast<Alloc>(FakeDriver("cuMemAlloc_v2"));
    auto copy = reinterpret_cast<CopyIn>(FakeDriver("cuMemcpyHtoD_v2"));
    std::vector<float> values(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f;
    ok_ = alloc != nullptr && copy != nullptr && PushFakePrimaryContext(ordinal) && alloc(&block_, bytes_) == 0 &&
          copy(block_, values.data(), bytes_) == 0;
  }
  ~OwnDeviceMemory() {
    using Free = int (*)(uint64_t);
    if (block_ != 0) reinterpret_cast<Free>(FakeDriver("cuMemFree_v2"))(block_);
  }
  OwnDeviceMemory(const OwnDeviceMemory&) = delete;
  OwnDeviceMemory& operator=(const OwnDeviceMemory&) = delete;

  bool ok() const { return ok_; }
  const void* ptr() const { return reinterpret_cast<const void*>(static_cast<uintptr_t>(block_)); }

 private:
  const size_t bytes_;
  uint64_t block_ = 0;
  bool ok_ = false;
};

// This process's calls of a fake driver entry point (tensord_fake_cuda_calls).
int FakeCalls(const char* symbol) {
  using Calls = int (*)(const char*);
  auto calls = reinterpret_cast<Calls>(FakeDriver("tensord_fake_cuda_calls"));
  return calls == nullptr ? -1 : calls(symbol);
}

// Writes float32[count] holding i * 0.5 + shift to device memory at `dst` on device 0, as
// a producer's kernel would (cuMemcpyHtoD in the primary context).
bool FillOnDevice(void* dst, int64_t count, float shift) {
  using Pop = int (*)(void**);
  using CopyIn = int (*)(uint64_t, const void*, size_t);
  auto pop = reinterpret_cast<Pop>(FakeDriver("cuCtxPopCurrent_v2"));
  auto copy = reinterpret_cast<CopyIn>(FakeDriver("cuMemcpyHtoD_v2"));
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f + shift;
  void* popped = nullptr;
  return pop != nullptr && copy != nullptr && PushFakePrimaryContext(0) &&
         copy(reinterpret_cast<uintptr_t>(dst), values.data(), values.size() * sizeof(float)) == 0 &&
         pop(&popped) == 0;
}

// float32[count] on this process's cuda device `ordinal`.
TensorSpec GpuFloats(int64_t count, int ordinal = 0) {
  TensorSpec spec;
  spec.dtype = dtypes::kFloat32;
  spec.shape = {count};
  spec.device = DLDevice{kDLCUDA, ordinal};
  return spec;
}

// A source whose drop the test can see: when, and on which thread.
struct DropWitness {
  std::atomic<bool> dropped{false};
  std::thread::id thread;  // written before `dropped` turns true

  static std::shared_ptr<const void> SourceFor(const OwnDeviceMemory& memory,
                                                const std::shared_ptr<DropWitness>& witness) {
    return std::shared_ptr<const void>(memory.ptr(), [witness](const void*) {
      witness->thread = std::this_thread::get_id();
      witness->dropped.store(true, std::memory_order_release);
    });
  }
  // Polls until dropped or `timeout`.
  bool WaitDropped(std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!dropped.load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }
};

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
    std::string out = RunToEnd(args);
    ::unsetenv("CUDA_VISIBLE_DEVICES");
    return out;
  }

  static const BackendInfo* Cuda(const BrokerStatus& status) { return FindBackend(status, "cuda"); }
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
  Result<TensorStat> retired = WaitUntilRetired(*client, id);
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

// The producer hands the owner of its memory to the client and drops its TensorRef at
// once: the client keeps the source while the name is bound and while a consumer in
// another process holds a lease, and drops it, on its own thread, once the broker reports
// that the last lease is gone.
TEST_F(CudaFakeDaemonTest, TheProducersSourceIsDroppedWhenTheLastLeaseOnItsExportGoes) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  OwnDeviceMemory memory(0, 1000);
  ASSERT_TRUE(memory.ok());
  auto witness = std::make_shared<DropWitness>();
  const TensorSpec spec = GpuFloats(1000);
  {
    auto exported = producer->ExportDevice(memory.ptr(), "gpu", spec, DropWitness::SourceFor(memory, witness));
    ASSERT_TRUE(exported.ok()) << exported.status().ToString();
    auto published = producer->Publish(*exported, "gpu/kept");
    ASSERT_TRUE(published.ok()) << published.status().ToString();
  }
  ASSERT_TRUE(producer->Flush().ok());  // the producer's own lease is released
  auto bound = producer->Stat("gpu/kept");
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_TRUE(bound->holders.empty());
  EXPECT_FALSE(witness->dropped.load());  // the name holds it

  ChildProcess consumer({TENSORD_CUDA_PEER, "hold", daemon.socket(), "gpu/kept", "1000"});
  ASSERT_EQ(consumer.WaitForLine(""), "held ok");
  ASSERT_TRUE(producer->Delete("gpu/kept").ok());
  ASSERT_TRUE(producer->Flush().ok());  // a notice sent before this reply has arrived
  auto leased = producer->Stat(TensorId{bound->info.tensor_id});
  ASSERT_TRUE(leased.ok()) << leased.status().ToString();
  EXPECT_EQ(leased->holders.size(), 1u);
  EXPECT_FALSE(witness->dropped.load());  // the consumer's lease holds it

  ASSERT_EQ(::kill(consumer.pid(), SIGUSR1), 0);
  ASSERT_EQ(consumer.WaitForLine(""), "released");
  EXPECT_TRUE(witness->WaitDropped(std::chrono::seconds(10)));
  EXPECT_NE(witness->thread, std::this_thread::get_id());
  auto status = producer->GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->tensors, 0u);
  EXPECT_EQ(Cuda(*status)->devices[0].bytes_in_use, 0u);
}

// A fork() drains the producer's Session stream, and a notice pushed while it has none is
// lost; the next stream starts with a cache_reset, after which the client asks the broker
// about what it keeps. Either way the source goes.
TEST_F(CudaFakeDaemonTest, AReleaseAroundAForkOfTheProducerStillDropsTheSource) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  OwnDeviceMemory memory(0, 1000);
  ASSERT_TRUE(memory.ok());
  auto witness = std::make_shared<DropWitness>();
  const TensorSpec spec = GpuFloats(1000);
  {
    auto exported = producer->ExportDevice(memory.ptr(), "gpu", spec, DropWitness::SourceFor(memory, witness));
    ASSERT_TRUE(exported.ok()) << exported.status().ToString();
    ASSERT_TRUE(producer->Publish(*exported, "gpu/kept").ok());
  }
  ChildProcess consumer({TENSORD_CUDA_PEER, "hold", daemon.socket(), "gpu/kept", "1000"});
  ASSERT_EQ(consumer.WaitForLine(""), "held ok");
  ASSERT_TRUE(producer->Delete("gpu/kept").ok());
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::kill(consumer.pid(), SIGUSR1), 0);
  ASSERT_EQ(consumer.WaitForLine(""), "released");
  int child_status = 0;
  ASSERT_EQ(::waitpid(child, &child_status, 0), child);
  EXPECT_TRUE(witness->WaitDropped(std::chrono::seconds(10)));
}

// Destroying the Client drops what it keeps, once its session is closed: a consumer's
// lease then holds a retired tensor that new acquires are refused.
TEST_F(CudaFakeDaemonTest, DestroyingTheProducersClientDropsTheSourcesItKeeps) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  OwnDeviceMemory memory(0, 1000);
  ASSERT_TRUE(memory.ok());
  auto witness = std::make_shared<DropWitness>();
  const TensorSpec spec = GpuFloats(1000);
  uint64_t id = 0;
  {
    auto exported = producer->ExportDevice(memory.ptr(), "gpu", spec, DropWitness::SourceFor(memory, witness));
    ASSERT_TRUE(exported.ok()) << exported.status().ToString();
    ASSERT_TRUE(producer->Publish(*exported, "gpu/kept").ok());
    id = exported->info().tensor_id;
  }
  ChildProcess consumer({TENSORD_CUDA_PEER, "hold", daemon.socket(), "gpu/kept", "1000"});
  ASSERT_EQ(consumer.WaitForLine(""), "held ok");
  EXPECT_FALSE(witness->dropped.load());
  producer.reset();
  EXPECT_TRUE(witness->dropped.load());  // by ~Client itself

  auto observer = Connect(daemon);
  ASSERT_NE(observer, nullptr);
  Result<TensorRef> again = observer->Acquire(TensorId{id});
  for (int i = 0; i < 500 && again.status().code() != StatusCode::kFailedPrecondition; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the daemon hears the close on its own time
    again = observer->Acquire(TensorId{id});
  }
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("exited; its memory was the producer's"));
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

// A steady producer on a GPU, and a consumer in another process that lets each item go
// before the next comes: the producer's next tensor of the same size in the same namespace
// lands in the same buffer, and no side makes a driver call for it. The daemon allocates
// nothing (the same buffer id every time), the producer maps nothing new (it keeps its
// writable mapping), the consumer imports and maps the buffer once and opens the producer's
// ready event once (the producer reuses it; the consumer keeps it opened). While pooled the
// buffer counts on its device; when the broker frees it (here its producer closes), the
// consumer's kept mapping goes with the broker's push, not after its 30 s linger.
TEST_F(CudaFakeDaemonTest, ARecycledDeviceBufferCostsNoDriverCallOnEitherSideAndIsFreedEverywhere) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  constexpr int64_t kCount = 1000;
  constexpr int kItems = 6;
  ChildProcess consumer({TENSORD_CUDA_PEER, "take-loop", daemon.socket(), "rc/", std::to_string(kCount),
                         std::to_string(kItems)});
  std::vector<std::string> lines;
  uint64_t buffer_id = 0;
  int imports_after_first = 0;
  int events_after_first = 0;
  for (int k = 0; k < kItems; ++k) {
    {
      auto tensor = producer->Allocate("rc", GpuFloats(kCount));
      ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
      if (k == 0) buffer_id = tensor->info().buffer_id;
      EXPECT_EQ(tensor->info().buffer_id, buffer_id) << "item " << k << " got a new buffer";
      ASSERT_TRUE(FillOnDevice(tensor->mutable_data(), kCount, static_cast<float>(k)));
      PublishOptions publish;
      publish.stream = 1;  // CU_STREAM_LEGACY: a ready event is recorded there
      ASSERT_TRUE(producer->Publish(*tensor, "rc/" + std::to_string(k), publish).ok());
    }
    ASSERT_TRUE(producer->Flush().ok());  // the producer's own lease is gone before the consumer's
    if (k == 0) {
      imports_after_first = FakeCalls("cuMemImportFromShareableHandle");
      events_after_first = FakeCalls("cuEventCreate");
    }
    lines.push_back(consumer.WaitForLine("took"));
  }
  EXPECT_EQ(FakeCalls("cuMemImportFromShareableHandle"), imports_after_first) << "the producer mapped again";
  EXPECT_EQ(FakeCalls("cuEventCreate"), events_after_first) << "the producer made new ready events";
  ASSERT_THAT(lines[0], ::testing::EndsWith(" ok"));
  const std::string rest = lines[0].substr(lines[0].find(" buffer "));
  EXPECT_THAT(rest, StartsWith(" buffer " + std::to_string(buffer_id) + " at "));
  for (int k = 0; k < kItems; ++k) EXPECT_EQ(lines[static_cast<size_t>(k)], "took " + std::to_string(k) + rest);
  EXPECT_EQ(consumer.WaitForLine("calls"),
            "calls import 1 map 1 open_event 1 wait_event " + std::to_string(kItems));
  EXPECT_EQ(consumer.WaitForLine("kept"), "kept 1");

  auto watcher = Connect(daemon);
  ASSERT_NE(watcher, nullptr);
  auto status = watcher->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  const DeviceUsage& gpu0 = Cuda(*status)->devices[0];
  EXPECT_EQ(gpu0.bytes_pooled, uint64_t{2} << 20);  // one buffer of the stand-in's granularity
  EXPECT_EQ(gpu0.bytes_in_use, gpu0.bytes_pooled) << "pooled bytes count in the device's quota";
  EXPECT_EQ(status->host_bytes_pooled, 0u);
  EXPECT_EQ(status->pooled_buffers, 1u);

  producer.reset();  // its pool goes with its session
  ASSERT_EQ(::kill(consumer.pid(), SIGUSR1), 0);
  EXPECT_EQ(consumer.WaitForLine("kept"), "kept 0") << "the consumer kept its mapping of a freed buffer";
  status = watcher->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(Cuda(*status)->devices[0].bytes_in_use, 0u);
}

// Memory pressure takes pooled device buffers back: another producer's allocation that the
// device quota cannot hold otherwise gets the memory of the first producer's idle buffer.
TEST_F(CudaFakeDaemonTest, APooledDeviceBufferIsTakenBackForAnAllocationTheQuotaCouldNotHold) {
  DaemonProcess daemon({"--max-device-bytes", "cuda:0=4MiB"});
  auto first = Connect(daemon);
  auto second = Connect(daemon);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  {
    auto tensor = first->Allocate("a", GpuFloats(1 << 19));  // 2 MiB
    ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
  }
  ASSERT_TRUE(first->Flush().ok());
  auto status = first->GetStatus();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(Cuda(*status)->devices[0].bytes_pooled, uint64_t{2} << 20) << "the buffer was not pooled";
  auto big = second->Allocate("b", GpuFloats(1 << 20));  // 4 MiB: only with the pooled 2 MiB back
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  status = first->GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(Cuda(*status)->devices[0].bytes_pooled, 0u);
  EXPECT_EQ(Cuda(*status)->devices[0].bytes_in_use, uint64_t{4} << 20);
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

// A trainer feeding a GPU from recycled host buffers: the pinned view of a recycled buffer
// stays registered between its tensors, so each later batch is already pinned.
TEST_F(CudaFakeDaemonTest, APinnedViewOfARecycledBufferStaysRegisteredForItsNextTensor) {
  DaemonProcess daemon;
  EXPECT_EQ(RunPeer({"pinned-recycled", daemon.socket(), "300000", "cpu"}),
            "recycled 1|registered 1|same view 1|values ok");
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

// Stream order (common/memory/stream_order.h) with the stand-in's events: a consumer's
// stream waits on the producer's ready event, and the consumer's release waits for its
// own done event. The stand-in holds recorded events pending until told its streams ran.
int FakeStreamWaits(uintptr_t stream, int exporter_pid, int pending_only) {
  using Waits = int (*)(uintptr_t, int, int);
  return reinterpret_cast<Waits>(FakeDriver("tensord_fake_cuda_stream_waits"))(stream, exporter_pid, pending_only);
}
void FakeHoldStreams(bool hold) {
  reinterpret_cast<void (*)(int)>(FakeDriver("tensord_fake_cuda_hold_streams"))(hold ? 1 : 0);
}
int FakeFinishStreams() { return reinterpret_cast<int (*)()>(FakeDriver("tensord_fake_cuda_finish_streams"))(); }

// Polls Stat until `holders` sessions hold the tensor, or `timeout`.
TEST_F(CudaFakeDaemonTest, AConsumersStreamWaitsForTheProducersWorkAndItsReleaseForItsOwn) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  OwnDeviceMemory source(0, 1000);
  ASSERT_TRUE(source.ok());
  const TensorSpec spec = GpuFloats(1000);
  constexpr uintptr_t kProducerStream = 0x5000;
  uint64_t tensor_id = 0;
  FakeHoldStreams(true);  // the producer's copy has not run when it publishes
  {
    auto tensor = producer->Allocate("gpu", spec);
    ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
    ASSERT_TRUE(tensor->CopyFromDevice(source.ptr(), 1000 * sizeof(float), kProducerStream).ok());
    PublishOptions publish;
    publish.stream = kProducerStream;
    auto published = producer->Publish(*tensor, "gpu/r", publish);
    ASSERT_TRUE(published.ok()) << published.status().ToString();
    tensor_id = published->tensor_id;
  }
  FakeHoldStreams(false);
  ASSERT_TRUE(producer->Flush().ok());

  // This process waits on its own event directly (it cannot open its own IPC handle).
  constexpr uintptr_t kOwnStream = 0x9000;
  AcquireOptions own;
  own.stream = kOwnStream;
  {
    auto again = producer->Acquire("gpu/r", own);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
  }
  EXPECT_EQ(FakeStreamWaits(kOwnStream, 0, 1), 1);
  ASSERT_TRUE(producer->Flush().ok());
  ASSERT_TRUE(WaitForHolders(*producer, tensor_id, 0, std::chrono::seconds(10)));

  // Another process: its stream waits on the producer's event, still pending.
  ChildProcess consumer({TENSORD_CUDA_PEER, "ordered", daemon.socket(), "gpu/r", "1000", "0x1234",
                         std::to_string(::getpid())});
  EXPECT_EQ(consumer.WaitForLine(""), "waits 1");
  EXPECT_EQ(consumer.WaitForLine(""), "ok");
  ASSERT_EQ(consumer.WaitForLine(""), "released");
  // Its done event is pending: the lease stays, however long that takes.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto held = producer->Stat(TensorId{tensor_id});
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held->holders.size(), 1u);
  ASSERT_EQ(::kill(consumer.pid(), SIGUSR1), 0);
  EXPECT_EQ(consumer.WaitForLine(""), "finished 1");
  EXPECT_TRUE(WaitForHolders(*producer, tensor_id, 0, std::chrono::seconds(10)));
  EXPECT_EQ(FakeFinishStreams(), 1);  // the producer's ready event, still held
}

TEST_F(CudaFakeDaemonTest, AfterItsProducerIsGoneATensorCarriesNoReadyEvent) {
  DaemonProcess daemon;
  // `produce` publishes on the legacy default stream and exits.
  EXPECT_EQ(RunPeer({"produce", daemon.socket(), "gpu/w", "0", "1000"}), "published 0");
  ChildProcess consumer({TENSORD_CUDA_PEER, "ordered", daemon.socket(), "gpu/w", "1000", "0x1234", "-1"});
  EXPECT_EQ(consumer.WaitForLine(""), "waits 0");  // on no event at all, from anyone
  EXPECT_EQ(consumer.WaitForLine(""), "ok");
  EXPECT_EQ(consumer.WaitForLine(""), "released");
}

}  // namespace
}  // namespace tensord::testing
