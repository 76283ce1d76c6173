// tensord_cuda_peer: a process holding CUDA tensors through the public client, for the
// cuda-fake integration tests. It runs against libtensord_fake_cuda.so (TENSORD_LIBCUDA),
// so it proves the plumbing between processes, never a GPU. Bytes are written and read
// with the driver API (cuMemcpyHtoD/DtoH), as a program with a real GPU would.
//
//   produce SOCKET NAME ORDINAL COUNT   allocate float32[COUNT] on cuda:ORDINAL, fill
//                                      element i with i * 0.5, publish NAME, print
//                                      "published <device_id>", exit
//   consume SOCKET NAME COUNT          acquire NAME, print "device <type> <id>", then "ok"
//                                      when every element is i * 0.5, else "mismatch"
//   export SOCKET NAME ORDINAL COUNT   cuMemAlloc a block on cuda:ORDINAL with kSlack bytes
//                                      of -1.0f in front of float32[COUNT] (element i is
//                                      i * 0.5), ExportDevice that interior pointer,
//                                      publish NAME, print "exported <device_id>", and
//                                      sleep until killed
//   pinned SOCKET COUNT NAME...        acquire every NAME (host float32[COUNT], element i
//                                      is i * 0.5) pinned: per NAME "device <type> <id>
//                                      readonly <0|1>" and "values ok"; then "registered <n>"
//                                      (the fake's live cuMemHostRegister ranges), releases
//                                      them and prints "registered <n>" once the count is 0
//                                      (or after 10 s). A refused pinned acquire prints
//                                      "error pinned: <status>" instead. Then acquires the
//                                      first NAME unpinned: "plain device <type>" and, for
//                                      host memory, "plain ok". Exits 0.
//   pinned-recycled SOCKET COUNT NS    produce host float32[COUNT] (i * 0.5) in namespace NS
//                                      as NS/r0, acquire it pinned, delete it and let go
//                                      (its buffer goes back to this producer's pool), then
//                                      produce NS/r1 (i * 0.5 + 1) and acquire it pinned;
//                                      print "recycled <0|1>|registered <n>|same view <0|1>|
//                                      values ok": whether NS/r1 got NS/r0's buffer, the live
//                                      registrations after letting go, whether the second
//                                      pinned view is the first one's mapping again
//   hold SOCKET NAME COUNT             as consume, printing "held ok"; then on SIGUSR1
//                                      release it, flush, print "released", and sleep
//                                      until killed
//   ordered SOCKET NAME COUNT STREAM PRODUCER_PID
//                                      acquire NAME (float32[COUNT] as above) with
//                                      AcquireOptions::stream = STREAM; print "waits <n>":
//                                      the fake's waits of STREAM on a then still pending
//                                      event of process PRODUCER_PID, then the values
//                                      check; hold this process's streams, release, flush,
//                                      print "released"; on SIGUSR1 finish the streams,
//                                      print "finished <n>" (events completed), and sleep
//                                      until killed
//   take-loop SOCKET PREFIX COUNT N    N times: take the oldest tensor under PREFIX (waiting;
//                                      item k is float32[COUNT] holding i * 0.5 + k), check
//                                      it, release and flush, then print "took <k> buffer
//                                      <id> at <device pointer> <ok|mismatch ...>". Then the
//                                      driver calls this process made ("calls import <n> map
//                                      <n> open_event <n> wait_event <n>", -1 each without the
//                                      stand-in) and "kept <n>", the stand-in's live mappings
//                                      (-1 without it); on SIGUSR1 waits up to 10 s for them
//                                      to go and prints "kept <n>" again; sleeps until killed
//   gated SOCKET NAME COUNT            acquire NAME (float32[COUNT], i * 0.5) on a new
//                                      non-blocking stream, queue its copy to pinned host
//                                      memory there, print "queued pending <0|1>" (whether
//                                      the stream was still waiting), then synchronize and
//                                      print "device <type> <id>" and the values check
// A failure prints "error <what>: <status>" and exits 1.
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tensord/client.h"

namespace {

using CopyToDevice = int (*)(uint64_t dst, const void* src, size_t bytes);
using AllocDevice = int (*)(uint64_t* ptr, size_t bytes);

// What `export` puts in front of the tensor in its allocation.
constexpr size_t kSlack = 256 * 1024;
using CopyToHost = int (*)(void* dst, uint64_t src, size_t bytes);

int Fail(const std::string& what, const tensord::Status& status) {
  std::printf("error %s: %s\n", what.c_str(), status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

void* Driver(const char* symbol) {
  const char* path = std::getenv("TENSORD_LIBCUDA");
  void* library = ::dlopen(path != nullptr ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return library == nullptr ? nullptr : ::dlsym(library, symbol);
}

// Copies need a current context, as on a real driver: the device's primary one. cuInit
// first, as a program with CUDA memory of its own has done before tensord sees it.
bool MakeCurrent(int ordinal) {
  using Init = int (*)(unsigned flags);
  using Retain = int (*)(void** context, int device);
  using Push = int (*)(void* context);
  auto init = reinterpret_cast<Init>(Driver("cuInit"));
  auto retain = reinterpret_cast<Retain>(Driver("cuDevicePrimaryCtxRetain"));
  auto push = reinterpret_cast<Push>(Driver("cuCtxPushCurrent_v2"));
  void* context = nullptr;
  return init != nullptr && retain != nullptr && push != nullptr && init(0) == 0 && retain(&context, ordinal) == 0 &&
         push(context) == 0;
}

// The fake's live cuMemHostRegister ranges in this process; -1 without the fake.
int LiveHostRegistrations() {
  using LiveObjects = int (*)(const char* kind);
  auto live = reinterpret_cast<LiveObjects>(Driver("tensord_fake_cuda_live_objects"));
  return live == nullptr ? -1 : live("host_register");
}

bool HoldsHalves(const tensord::TensorRef& tensor, int64_t count) {
  const auto* values = static_cast<const float*>(tensor.data());
  for (int64_t i = 0; i < count; ++i) {
    if (values[i] != static_cast<float>(i) * 0.5f) return false;
  }
  return true;
}

int Pinned(tensord::Client& client, int64_t count, const std::vector<std::string>& names) {
  tensord::AcquireOptions options;
  options.pinned = true;
  auto tensors = client.AcquireMany(names, options);
  if (!tensors.ok()) {
    std::printf("error pinned: %s\n", tensors.status().ToString().c_str());
  } else {
    for (const tensord::TensorRef& tensor : *tensors) {
      std::printf("device %d %d readonly %d\n", static_cast<int>(tensor.info().device.device_type),
                  tensor.info().device.device_id, tensor.readonly() ? 1 : 0);
      std::printf("%s\n", HoldsHalves(tensor, count) ? "values ok" : "values mismatch");
    }
    std::printf("registered %d\n", LiveHostRegistrations());
    tensors->clear();
    (void)client.Flush();
    int live = LiveHostRegistrations();
    for (int i = 0; i < 1000 && live > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      live = LiveHostRegistrations();
    }
    std::printf("registered %d\n", live);
  }
  auto plain = client.Acquire(names[0]);
  if (!plain.ok()) return Fail("plain", plain.status());
  std::printf("plain device %d\n", static_cast<int>(plain->info().device.device_type));
  if (plain->info().device.device_type == tensord::kDLCPU) {
    std::printf("%s\n", HoldsHalves(*plain, count) ? "plain ok" : "plain mismatch");
  }
  return 0;
}

// Publishes host float32[count] holding i * 0.5 + shift as `name` (in its namespace);
// returns its buffer id, 0 on failure.
uint64_t ProduceHost(tensord::Client& client, const std::string& name, int64_t count, float shift) {
  tensord::TensorSpec spec;
  spec.shape = {count};
  auto tensor = client.Allocate(name.substr(0, name.find('/')), spec);
  if (!tensor.ok()) {
    Fail("allocate", tensor.status());
    return 0;
  }
  auto* values = static_cast<float*>(tensor->mutable_data());
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<float>(i) * 0.5f + shift;
  if (auto published = client.Publish(*tensor, name); !published.ok()) {
    Fail("publish", published.status());
    return 0;
  }
  return tensor->info().buffer_id;
}

int PinnedRecycled(tensord::Client& client, int64_t count, const std::string& ns) {
  tensord::AcquireOptions pinned;
  pinned.pinned = true;
  const uint64_t first_buffer = ProduceHost(client, ns + "/r0", count, 0.0f);
  if (first_buffer == 0) return 1;
  const void* first_view = nullptr;
  {
    auto view = client.Acquire(ns + "/r0", pinned);
    if (!view.ok()) return Fail("pinned", view.status());
    first_view = view->data();
    if (tensord::Status deleted = client.Delete(ns + "/r0"); !deleted.ok()) return Fail("delete", deleted);
  }
  if (tensord::Status flushed = client.Flush(); !flushed.ok()) return Fail("flush", flushed);
  // The broker pools the buffer once the releases are in: poll until the next allocation
  // gets it back (a fresh one is given back at once and tried again).
  uint64_t second_buffer = 0;
  for (int i = 0; i < 200 && second_buffer != first_buffer; ++i) {
    second_buffer = ProduceHost(client, ns + "/r1", count, 1.0f);
    if (second_buffer == 0) return 1;
    if (second_buffer != first_buffer) {
      (void)client.Delete(ns + "/r1");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  const int registered = LiveHostRegistrations();
  auto view = client.Acquire(ns + "/r1", pinned);
  if (!view.ok()) return Fail("pinned", view.status());
  const auto* values = static_cast<const float*>(view->data());
  bool ok = true;
  for (int64_t i = 0; i < count; ++i) ok = ok && values[i] == static_cast<float>(i) * 0.5f + 1.0f;
  std::printf("recycled %d|registered %d|same view %d|values %s\n", second_buffer == first_buffer ? 1 : 0,
              registered, view->data() == first_view ? 1 : 0, ok ? "ok" : "mismatch");
  return 0;
}

// "ok" when the tensor holds COUNT elements i * 0.5 + shift, else what is wrong.
std::string Check(const tensord::TensorRef& tensor, int64_t count, float shift = 0.0f) {
  std::vector<float> values(static_cast<size_t>(count));
  auto copy = reinterpret_cast<CopyToHost>(Driver("cuMemcpyDtoH_v2"));
  if (copy == nullptr || !MakeCurrent(tensor.info().device.device_id) ||
      copy(values.data(), reinterpret_cast<uintptr_t>(tensor.data()), values.size() * sizeof(float)) != 0) {
    return "error copy: cuMemcpyDtoH failed";
  }
  for (int64_t i = 0; i < count; ++i) {
    if (values[static_cast<size_t>(i)] != static_cast<float>(i) * 0.5f + shift) {
      return "mismatch at " + std::to_string(i);
    }
  }
  return "ok";
}

// The stand-in's count of this process's calls of `symbol`; -1 on a real driver.
int FakeCalls(const char* symbol) {
  using Calls = int (*)(const char* symbol);
  auto calls = reinterpret_cast<Calls>(Driver("tensord_fake_cuda_calls"));
  return calls == nullptr ? -1 : calls(symbol);
}

int FakeLiveMappings() {
  using LiveObjects = int (*)(const char* kind);
  auto live = reinterpret_cast<LiveObjects>(Driver("tensord_fake_cuda_live_objects"));
  return live == nullptr ? -1 : live("mapping");
}

int TakeLoop(tensord::Client& client, const std::string& prefix, int64_t count, int n, const sigset_t& usr1) {
  tensord::TakeOptions take;
  take.wait = tensord::Wait::Forever();
  for (int k = 0; k < n; ++k) {
    std::string line;
    {
      auto tensor = client.Take(prefix, take);
      if (!tensor.ok()) return Fail("take", tensor.status());
      char where[64];
      std::snprintf(where, sizeof(where), "%p", tensor->data());
      line = "took " + std::to_string(k) + " buffer " + std::to_string(tensor->info().buffer_id) + " at " + where +
             " " + Check(*tensor, count, static_cast<float>(k));
    }
    if (tensord::Status flushed = client.Flush(); !flushed.ok()) return Fail("flush", flushed);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  std::printf("calls import %d map %d open_event %d wait_event %d\n", FakeCalls("cuMemImportFromShareableHandle"),
              FakeCalls("cuMemMap"), FakeCalls("cuIpcOpenEventHandle"), FakeCalls("cuStreamWaitEvent"));
  std::printf("kept %d\n", FakeLiveMappings());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&usr1, &signal);
  int kept = FakeLiveMappings();
  for (int i = 0; i < 1000 && kept > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    kept = FakeLiveMappings();
  }
  std::printf("kept %d\n", kept);
  std::fflush(stdout);
  for (;;) ::pause();
}

// The consumer's half of the gated stream-order test (cuda_gpu_test.cc).
int Gated(tensord::Client& client, const std::string& name, int64_t count) {
  using StreamCreate = int (*)(void** stream, unsigned flags);
  using StreamQuery = int (*)(void* stream);
  using StreamSynchronize = int (*)(void* stream);
  using HostAlloc = int (*)(void** p, size_t bytes);
  using CopyAsync = int (*)(void* dst, uint64_t src, size_t bytes, void* stream);
  auto create = reinterpret_cast<StreamCreate>(Driver("cuStreamCreate"));
  auto query = reinterpret_cast<StreamQuery>(Driver("cuStreamQuery"));
  auto synchronize = reinterpret_cast<StreamSynchronize>(Driver("cuStreamSynchronize"));
  auto host_alloc = reinterpret_cast<HostAlloc>(Driver("cuMemAllocHost_v2"));
  auto copy = reinterpret_cast<CopyAsync>(Driver("cuMemcpyDtoHAsync_v2"));
  void* stream = nullptr;
  void* host = nullptr;
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  if (create == nullptr || query == nullptr || synchronize == nullptr || host_alloc == nullptr || copy == nullptr ||
      !MakeCurrent(0) || create(&stream, 1 /* CU_STREAM_NON_BLOCKING */) != 0 || host_alloc(&host, bytes) != 0) {
    std::printf("error driver: no stream or pinned host memory\n");
    return 1;
  }
  tensord::AcquireOptions acquire;
  acquire.stream = reinterpret_cast<uintptr_t>(stream);
  auto tensor = client.Acquire(name, acquire);
  if (!tensor.ok()) return Fail("acquire", tensor.status());
  if (copy(host, reinterpret_cast<uintptr_t>(tensor->data()), bytes, stream) != 0) {
    std::printf("error copy: cuMemcpyDtoHAsync failed\n");
    return 1;
  }
  std::printf("queued pending %d\n", query(stream) == 600 /* CUDA_ERROR_NOT_READY */ ? 1 : 0);
  std::fflush(stdout);
  if (synchronize(stream) != 0) {
    std::printf("error synchronize: cuStreamSynchronize failed\n");
    return 1;
  }
  std::printf("device %d %d\n", static_cast<int>(tensor->info().device.device_type), tensor->info().device.device_id);
  const auto* values = static_cast<const float*>(host);
  for (int64_t i = 0; i < count; ++i) {
    if (values[i] != static_cast<float>(i) * 0.5f) {
      std::printf("mismatch at %lld\n", static_cast<long long>(i));
      return 1;
    }
  }
  std::printf("ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: tensord_cuda_peer produce|consume|export|hold SOCKET NAME ...\n");
    return 2;
  }
  const std::string command = argv[1];
  // Before any thread starts, so that every one inherits it: `hold` takes SIGUSR1 with
  // sigwait().
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  tensord::ClientOptions options;
  options.socket_path = argv[2];
  if (command == "pinned-recycled") {
    // A reader keeps its mapping of a recycled buffer (and so its registration) this long.
    options.lease_cache = false;
    options.lease_cache_linger = std::chrono::seconds(30);
  }
  if (command == "take-loop") {
    // A reader keeps its mapping of a recycled buffer this long: what drops it in the test
    // is the broker's push, not the linger.
    options.lease_cache = false;
    options.lease_cache_linger = std::chrono::seconds(30);
  }
  if (command == "pinned" || command == "ordered") {
    // Leases and mappings go soon after their last reference, so the registration count
    // and a release held for a done event can be watched.
    options.lease_cache = false;
    options.lease_cache_linger = std::chrono::milliseconds(50);
  }
  auto client = tensord::Client::Connect(options);
  if (!client.ok()) return Fail("connect", client.status());
  const std::string name = argv[3];
  if (command == "produce" && argc == 6) {
    const int ordinal = std::atoi(argv[4]);
    const int64_t count = std::atoll(argv[5]);
    tensord::TensorSpec spec;
    spec.dtype = tensord::dtypes::kFloat32;
    spec.shape = {count};
    spec.device = tensord::DLDevice{tensord::kDLCUDA, ordinal};
    auto tensor = (*client)->Allocate(name.substr(0, name.find('/')), spec);
    if (!tensor.ok()) return Fail("allocate", tensor.status());
    std::vector<float> values(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f;
    auto copy = reinterpret_cast<CopyToDevice>(Driver("cuMemcpyHtoD_v2"));
    if (copy == nullptr || !MakeCurrent(tensor->info().device.device_id) ||
        copy(reinterpret_cast<uintptr_t>(tensor->mutable_data()), values.data(), values.size() * sizeof(float)) != 0) {
      std::printf("error copy: cuMemcpyHtoD failed\n");
      return 1;
    }
    auto published = (*client)->Publish(*tensor, name);
    if (!published.ok()) return Fail("publish", published.status());
    std::printf("published %d\n", tensor->info().device.device_id);
    return 0;
  }
  if (command == "export" && argc == 6) {
    const int ordinal = std::atoi(argv[4]);
    const int64_t count = std::atoll(argv[5]);
    // As a program with its own CUDA memory (a torch tensor) has it: cuMemAlloc in the
    // device's primary context, the tensor somewhere inside the block.
    std::vector<float> values(kSlack / sizeof(float) + static_cast<size_t>(count), -1.0f);
    const size_t first = kSlack / sizeof(float);
    for (int64_t i = 0; i < count; ++i) values[first + static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f;
    auto alloc = reinterpret_cast<AllocDevice>(Driver("cuMemAlloc_v2"));
    auto copy = reinterpret_cast<CopyToDevice>(Driver("cuMemcpyHtoD_v2"));
    const size_t bytes = values.size() * sizeof(float);
    uint64_t block = 0;
    if (alloc == nullptr || copy == nullptr || !MakeCurrent(ordinal) || alloc(&block, bytes) != 0 ||
        copy(block, values.data(), bytes) != 0) {
      std::printf("error copy: cuMemAlloc or cuMemcpyHtoD failed\n");
      return 1;
    }
    tensord::TensorSpec spec;
    spec.dtype = tensord::dtypes::kFloat32;
    spec.shape = {count};
    spec.device = tensord::DLDevice{tensord::kDLCUDA, ordinal};
    const void* tensor_ptr = reinterpret_cast<const void*>(static_cast<uintptr_t>(block + kSlack));
    auto tensor = (*client)->ExportDevice(tensor_ptr, name.substr(0, name.find('/')), spec);
    if (!tensor.ok()) return Fail("export", tensor.status());
    if (tensor->data() != tensor_ptr) {
      std::printf("error export: the producer's view is not its own pointer\n");
      return 1;
    }
    auto published = (*client)->Publish(*tensor, name);
    if (!published.ok()) return Fail("publish", published.status());
    std::printf("exported %d\n", tensor->info().device.device_id);
    std::fflush(stdout);
    for (;;) ::pause();  // the memory is ours: keep it until killed
  }
  if (command == "pinned") {
    return Pinned(**client, std::atoll(argv[3]), std::vector<std::string>(argv + 4, argv + argc));
  }
  if (command == "pinned-recycled" && argc == 5) {
    return PinnedRecycled(**client, std::atoll(argv[3]), argv[4]);
  }
  if (command == "take-loop" && argc == 6) {
    return TakeLoop(**client, name, std::atoll(argv[4]), std::atoi(argv[5]), usr1);
  }
  if (command == "gated" && argc == 5) {
    return Gated(**client, name, std::atoll(argv[4]));
  }
  if (command == "consume" && argc == 5) {
    const int64_t count = std::atoll(argv[4]);
    auto tensor = (*client)->Acquire(name);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    std::printf("device %d %d\n", static_cast<int>(tensor->info().device.device_type), tensor->info().device.device_id);
    const std::string checked = Check(*tensor, count);
    std::printf("%s\n", checked.c_str());
    return checked == "ok" ? 0 : 1;
  }
  if (command == "hold" && argc == 5) {
    const int64_t count = std::atoll(argv[4]);
    auto tensor = (*client)->Acquire(name);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    std::printf("held %s\n", Check(*tensor, count).c_str());
    std::fflush(stdout);
    int signal = 0;
    sigwait(&usr1, &signal);
    tensor->Release();
    tensord::Status flushed = (*client)->Flush();
    if (!flushed.ok()) return Fail("flush", flushed);
    std::printf("released\n");
    std::fflush(stdout);
    for (;;) ::pause();  // the session stays: only the release may free the export
  }
  if (command == "ordered" && argc == 7) {
    const int64_t count = std::atoll(argv[4]);
    tensord::AcquireOptions acquire;
    acquire.stream = static_cast<uintptr_t>(std::strtoull(argv[5], nullptr, 0));
    const int producer_pid = std::atoi(argv[6]);
    using Waits = int (*)(uintptr_t stream, int exporter_pid, int pending_only);
    using Hold = void (*)(int hold);
    using Finish = int (*)();
    auto waits = reinterpret_cast<Waits>(Driver("tensord_fake_cuda_stream_waits"));
    auto hold = reinterpret_cast<Hold>(Driver("tensord_fake_cuda_hold_streams"));
    auto finish = reinterpret_cast<Finish>(Driver("tensord_fake_cuda_finish_streams"));
    if (waits == nullptr || hold == nullptr || finish == nullptr) {
      std::printf("error fake: the stand-in's test queries are missing\n");
      return 1;
    }
    auto tensor = (*client)->Acquire(name, acquire);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    std::printf("waits %d\n", waits(acquire.stream, producer_pid, 1));
    std::printf("%s\n", Check(*tensor, count).c_str());
    // The consumer's kernels are still running when it lets go.
    hold(1);
    tensor->Release();
    tensord::Status flushed = (*client)->Flush();
    if (!flushed.ok()) return Fail("flush", flushed);
    std::printf("released\n");
    std::fflush(stdout);
    int signal = 0;
    sigwait(&usr1, &signal);
    std::printf("finished %d\n", finish());
    std::fflush(stdout);
    for (;;) ::pause();
  }
  std::fprintf(stderr, "tensord_cuda_peer: unknown command or arguments\n");
  return 2;
}
