// tensord_cuda_bench: device-tensor figures on a real GPU, against a running daemon.
//
//   tensord --socket /tmp/b/tensord.sock &
//   tensord_cuda_bench --socket /tmp/b/tensord.sock [--count N]
//
// Two sessions in this one process, a producer and a consumer (each maps what it acquires
// as another process would: the broker's fd, cuMemImportFromShareableHandle, map, access):
//   acquire, uncached  a fresh 2 MiB tensor each time (fetch, import, map, set access),
//                      acquire to first reference, lease cache off
//   acquire, cached    the same name again and again (lease cache hit: no round trip)
//   handoff 64 MiB     allocate, fill on a stream (cuMemsetD32Async), publish with the
//                      ready event, acquire on another stream, read it (a device copy),
//                      drop; handoffs/s and GB/s once both streams have finished
// Prints one line per figure. Without a driver or a GPU it says why and exits 0. Not run on
// hardware yet (docs/memory-backends.md). TENSORD_LIBCUDA (the test hook that names another
// libcuda, e.g. tests/fake_cuda's stand-in, for the daemon and this program alike) checks
// the program itself; the figures then say nothing about a GPU, and it says so.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tensord/client.h"
#include "tests/cuda/driver_calls.h"

namespace {

using Clock = std::chrono::steady_clock;

using tensord::testing::DriverCalls;

[[noreturn]] void Die(const std::string& what, const tensord::Status& status) {
  std::fprintf(stderr, "tensord_cuda_bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

std::unique_ptr<tensord::Client> Connect(const std::string& socket, bool lease_cache) {
  tensord::ClientOptions options;
  options.socket_path = socket;
  options.lease_cache = lease_cache;
  auto client = tensord::Client::Connect(options);
  if (!client.ok()) Die("connect", client.status());
  return std::move(client).value();
}

tensord::TensorSpec Floats(int64_t count) {
  tensord::TensorSpec spec;
  spec.dtype = tensord::dtypes::kFloat32;
  spec.shape = {count};
  spec.device = tensord::DLDevice{tensord::kDLCUDA, 0};
  return spec;
}

void Publish(tensord::Client& producer, const std::string& name, int64_t count) {
  auto tensor = producer.Allocate("bench", Floats(count));
  if (!tensor.ok()) Die("allocate", tensor.status());
  auto published = producer.Publish(*tensor, name);
  if (!published.ok()) Die("publish", published.status());
}

void PrintLatency(const char* what, std::vector<double> micros) {
  std::sort(micros.begin(), micros.end());
  auto at = [&](double q) { return micros[static_cast<size_t>(q * static_cast<double>(micros.size() - 1))]; };
  std::printf("%-22s n=%zu  p50 %.1f us  p99 %.1f us\n", what, micros.size(), at(0.5), at(0.99));
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  int count = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--socket") == 0) socket = argv[i + 1];
    if (std::strcmp(argv[i], "--count") == 0) count = std::max(2, std::atoi(argv[i + 1]));
  }
  if (socket.empty()) {
    std::fprintf(stderr, "usage: tensord_cuda_bench --socket PATH [--count N]\n");
    return 2;
  }
  const DriverCalls& d = DriverCalls::Get();
  if (!d.why_not.empty()) {
    std::printf("tensord_cuda_bench: no CUDA GPU here (%s): nothing measured\n", d.why_not.c_str());
    return 0;
  }
  if (d.library != "libcuda.so.1") {
    std::printf("tensord_cuda_bench: driver %s (TENSORD_LIBCUDA): not a GPU, the figures mean nothing\n",
                d.library.c_str());
  }
  if (!d.MakeCurrent(0)) {
    std::fprintf(stderr, "tensord_cuda_bench: cannot make cuda:0 current\n");
    return 1;
  }
  auto producer = Connect(socket, true);
  auto uncached = Connect(socket, false);
  auto cached = Connect(socket, true);
  constexpr int64_t kSmall = (2 << 20) / 4;  // one 2 MiB granule

  std::vector<double> micros;
  for (int i = 0; i < count; ++i) {
    const std::string name = "bench/u" + std::to_string(i);
    Publish(*producer, name, kSmall);
    const auto start = Clock::now();
    auto tensor = uncached->Acquire(name);
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (!tensor.ok()) Die("acquire", tensor.status());
    tensor->Release();
    (void)producer->Delete(name);
  }
  PrintLatency("acquire, uncached", micros);

  Publish(*producer, "bench/c", kSmall);
  micros.clear();
  for (int i = 0; i < count * 10; ++i) {
    const auto start = Clock::now();
    auto tensor = cached->Acquire("bench/c");
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (!tensor.ok()) Die("acquire", tensor.status());
  }
  PrintLatency("acquire, cached", micros);

  constexpr int64_t kBig = (64 << 20) / 4;
  void* write = nullptr;
  void* read = nullptr;
  uint64_t scratch = 0;
  if (d.stream_create(&write, DriverCalls::kStreamNonBlocking) != 0 ||
      d.stream_create(&read, DriverCalls::kStreamNonBlocking) != 0 || d.alloc(&scratch, kBig * 4) != 0) {
    std::fprintf(stderr, "tensord_cuda_bench: cannot create streams or scratch memory\n");
    return 1;
  }
  const int handoffs = std::max(10, count / 2);
  tensord::PublishOptions publish;
  publish.stream = reinterpret_cast<uintptr_t>(write);
  tensord::AcquireOptions acquire;
  acquire.stream = reinterpret_cast<uintptr_t>(read);
  const auto start = Clock::now();
  for (int i = 0; i < handoffs; ++i) {
    const std::string name = "bench/h" + std::to_string(i);
    {
      auto tensor = producer->Allocate("bench", Floats(kBig));
      if (!tensor.ok()) Die("allocate", tensor.status());
      d.memset_async(reinterpret_cast<uint64_t>(tensor->mutable_data()), static_cast<unsigned>(i), kBig, write);
      auto published = producer->Publish(*tensor, name, publish);
      if (!published.ok()) Die("publish", published.status());
    }
    auto taken = uncached->Take(name);
    if (!taken.ok()) Die("take", taken.status());
    if (auto ordered = taken->UseOnStream(acquire.stream); !ordered.ok()) Die("use on stream", ordered);
    d.copy_async(scratch, reinterpret_cast<uint64_t>(taken->data()), kBig * 4, read);
  }
  d.stream_synchronize(write);
  d.stream_synchronize(read);
  (void)uncached->Flush();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%-22s n=%d  %.1f /s  %.2f GB/s (written on one stream, read on another)\n", "handoff 64 MiB",
              handoffs, handoffs / seconds, handoffs * static_cast<double>(kBig * 4) / seconds / 1e9);
  return 0;
}
