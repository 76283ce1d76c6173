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
// A failure prints "error <what>: <status>" and exits 1.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tensord/client.h"

namespace {

using CopyToDevice = int (*)(uint64_t dst, const void* src, size_t bytes);
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

// Copies need a current context, as on a real driver: the device's primary one.
bool MakeCurrent(int ordinal) {
  using Retain = int (*)(void** context, int device);
  using Push = int (*)(void* context);
  auto retain = reinterpret_cast<Retain>(Driver("cuDevicePrimaryCtxRetain"));
  auto push = reinterpret_cast<Push>(Driver("cuCtxPushCurrent_v2"));
  void* context = nullptr;
  return retain != nullptr && push != nullptr && retain(&context, ordinal) == 0 && push(context) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: tensord_cuda_peer produce|consume SOCKET NAME ...\n");
    return 2;
  }
  const std::string command = argv[1];
  tensord::ClientOptions options;
  options.socket_path = argv[2];
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
  if (command == "consume" && argc == 5) {
    const int64_t count = std::atoll(argv[4]);
    auto tensor = (*client)->Acquire(name);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    std::printf("device %d %d\n", static_cast<int>(tensor->info().device.device_type), tensor->info().device.device_id);
    std::vector<float> values(static_cast<size_t>(count));
    auto copy = reinterpret_cast<CopyToHost>(Driver("cuMemcpyDtoH_v2"));
    if (copy == nullptr || !MakeCurrent(tensor->info().device.device_id) ||
        copy(values.data(), reinterpret_cast<uintptr_t>(tensor->data()), values.size() * sizeof(float)) != 0) {
      std::printf("error copy: cuMemcpyDtoH failed\n");
      return 1;
    }
    for (int64_t i = 0; i < count; ++i) {
      if (values[static_cast<size_t>(i)] != static_cast<float>(i) * 0.5f) {
        std::printf("mismatch at %lld\n", static_cast<long long>(i));
        return 1;
      }
    }
    std::printf("ok\n");
    return 0;
  }
  std::fprintf(stderr, "tensord_cuda_peer: unknown command or arguments\n");
  return 2;
}
