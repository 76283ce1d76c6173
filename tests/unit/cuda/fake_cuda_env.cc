#include "tests/unit/cuda/fake_cuda_env.h"

#include <dlfcn.h>
#include <stdlib.h>

#include "common/check.h"
#include "common/memory/cuda/cuda_driver.h"

namespace tensord::common::testing {
namespace {

// Before main(), and again in every death-test child (they re-run the binary).
[[maybe_unused]] const bool kEnvironmentSet = [] {
  ::setenv("TENSORD_LIBCUDA", TENSORD_FAKE_CUDA_PATH, /*overwrite=*/1);
  ::setenv("TENSORD_FAKE_CUDA_DEVICES", "2", /*overwrite=*/0);
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  return true;
}();

}  // namespace

void* FakeSymbol(const char* name) {
  // The library CudaDriver loaded (RTLD_NOLOAD: never a second copy).
  (void)CudaDriver::Get();
  void* handle = ::dlopen(TENSORD_FAKE_CUDA_PATH, RTLD_NOW | RTLD_NOLOAD);
  TENSORD_CHECK(handle != nullptr);
  void* symbol = ::dlsym(handle, name);
  TENSORD_CHECK(symbol != nullptr);
  return symbol;
}

int FakeLiveObjects(const char* kind) {
  return reinterpret_cast<int (*)(const char*)>(FakeSymbol("tensord_fake_cuda_live_objects"))(kind);
}

int FakePrimaryContextRetains(int ordinal) {
  return reinterpret_cast<int (*)(int)>(FakeSymbol("tensord_fake_cuda_primary_context_retains"))(ordinal);
}

void FakeFailNext(const char* symbol, int cuda_result) {
  reinterpret_cast<void (*)(const char*, int)>(FakeSymbol("tensord_fake_cuda_fail_next"))(symbol, cuda_result);
}

std::string FakeUuid(int physical) {
  const unsigned char b[16] = {0x8a, 0x3f, 0x1c, 0x5e, 0x22, 0x41, 0x4b, 0x7d,
                               0x9c, 0x0e, 0x6f, 0x13, 0x55, 0xa2, 0x00, static_cast<unsigned char>(physical)};
  return std::string(reinterpret_cast<const char*>(b), 16);
}

std::string FakeUuidText(int physical) { return FormatGpuUuid(FakeUuid(physical)); }

}  // namespace tensord::common::testing
