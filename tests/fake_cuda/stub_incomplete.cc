// libtensord_fake_cuda_incomplete.so: a library that exports cuInit and nothing else, so
// tests can check that CudaDriver names the first entry point it cannot resolve. A test
// fixture, not a driver.
#include <cuda.h>

extern "C" CUresult CUDAAPI cuInit(unsigned int Flags) { return Flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
