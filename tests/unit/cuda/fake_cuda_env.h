// Helpers of the cuda-fake tests. Every test binary here links fake_cuda_env.cc, which
// points TENSORD_LIBCUDA at libtensord_fake_cuda.so (two devices unless a test says
// otherwise) before main(), so CudaDriver::Get() loads the stand-in, never a real driver.
#pragma once

#include <cstdlib>
#include <string>

namespace tensord::common::testing {

// The fake's test-only queries (tests/fake_cuda/fake_cuda_queries.cc), looked up with dlsym in the
// library CudaDriver loaded. `kind` null counts everything.
int FakeLiveObjects(const char* kind = nullptr);
// Any symbol of the fake CudaDriver loaded (CHECKed to exist): e.g. the test producer's
// cuMemAlloc_v2, which CudaDriver does not resolve.
void* FakeSymbol(const char* name);
int FakePrimaryContextRetains(int ordinal);
void FakeFailNext(const char* symbol, int cuda_result);

// The fake's UUID (16 raw bytes) and GPU-... text of physical device `physical`.
std::string FakeUuid(int physical);
std::string FakeUuidText(int physical);

}  // namespace tensord::common::testing
