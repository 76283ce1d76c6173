// DriverCalls: the libcuda entry points a test program calls itself, as a program with CUDA
// work of its own (a torch process) would: contexts, streams, memory and copies, outside
// tensord. Loaded once, from $TENSORD_LIBCUDA when set (a stand-in such as tests/fake_cuda)
// or libcuda.so.1; why_not() says why they cannot be used (no driver, a missing symbol, no
// device), and then no entry point may be called.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace tensord::testing {

struct DriverCalls {
  int (*init)(unsigned) = nullptr;
  int (*device_count)(int*) = nullptr;
  int (*retain)(void**, int) = nullptr;
  int (*push)(void*) = nullptr;
  int (*stream_create)(void**, unsigned) = nullptr;
  int (*stream_synchronize)(void*) = nullptr;
  int (*alloc)(uint64_t*, size_t) = nullptr;
  int (*free)(uint64_t) = nullptr;
  int (*copy_in)(uint64_t, const void*, size_t) = nullptr;
  int (*copy_out)(void*, uint64_t, size_t) = nullptr;
  int (*pointer_attribute)(void*, int, uint64_t) = nullptr;
  int (*memset_async)(uint64_t, unsigned, size_t, void*) = nullptr;
  int (*copy_async)(uint64_t, uint64_t, size_t, void*) = nullptr;
  int (*stream_query)(void*) = nullptr;
  // cuStreamWaitValue32: work queued after it waits until the 32-bit word at a device
  // address is at least a value (CU_STREAM_WAIT_VALUE_GEQ): a gate the test opens.
  int (*wait_value32)(void*, uint64_t, uint32_t, unsigned) = nullptr;
  std::string library = "libcuda.so.1";
  std::string why_not;  // empty: usable

  static constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING
  static constexpr int kPointerDevicePointer = 3;    // CU_POINTER_ATTRIBUTE_DEVICE_POINTER
  static constexpr int kNotReady = 600;              // CUDA_ERROR_NOT_READY

  // Whether the driver knows host pointer `p` as pinned: registered or driver-allocated host
  // memory has a device pointer; plain pageable memory answers CUDA_ERROR_INVALID_VALUE.
  bool IsPinnedHost(const void* p) const {
    uint64_t device_pointer = 0;
    return pointer_attribute(&device_pointer, kPointerDevicePointer, reinterpret_cast<uintptr_t>(p)) == 0;
  }

  static const DriverCalls& Get() {
    static const DriverCalls* calls = new DriverCalls();
    return *calls;
  }

  // Makes device `ordinal`'s primary context current on this thread.
  bool MakeCurrent(int ordinal) const {
    void* context = nullptr;
    return why_not.empty() && retain(&context, ordinal) == 0 && push(context) == 0;
  }

 private:
  DriverCalls() {
    if (const char* other = std::getenv("TENSORD_LIBCUDA"); other != nullptr) library = other;
    void* lib = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      why_not = library + " not found (" + ::dlerror() + "): no NVIDIA driver";
      return;
    }
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      if (fn == nullptr && why_not.empty()) why_not = library + " lacks " + name;
    };
    get(init, "cuInit");
    get(device_count, "cuDeviceGetCount");
    get(retain, "cuDevicePrimaryCtxRetain");
    get(push, "cuCtxPushCurrent_v2");
    get(stream_create, "cuStreamCreate");
    get(stream_synchronize, "cuStreamSynchronize");
    get(alloc, "cuMemAlloc_v2");
    get(free, "cuMemFree_v2");
    get(copy_in, "cuMemcpyHtoD_v2");
    get(copy_out, "cuMemcpyDtoH_v2");
    get(pointer_attribute, "cuPointerGetAttribute");
    get(memset_async, "cuMemsetD32Async");
    get(copy_async, "cuMemcpyDtoDAsync_v2");
    // Optional: null where the library lacks them (the stand-in); a test that needs them
    // says so.
    auto optional = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
    };
    optional(stream_query, "cuStreamQuery");
    // CUDA 12 and later export the stream memory operations as _v2.
    optional(wait_value32, "cuStreamWaitValue32_v2");
    int count = 0;
    if (why_not.empty() && (init(0) != 0 || device_count(&count) != 0 || count == 0)) {
      why_not = "the driver sees no CUDA device";
    }
  }
};

}  // namespace tensord::testing
