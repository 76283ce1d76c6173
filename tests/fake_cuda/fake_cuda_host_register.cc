// libtensord_fake_cuda.so: pinned host memory, cuMemHostRegister_v2 and cuMemHostUnregister
// (the rules are described below).
#include "tests/fake_cuda/fake_cuda_state.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>

using fake_cuda::Current;

// ---- Pinned host memory: cuMemHostRegister_v2 / cuMemHostUnregister ----
//
// Nothing is page-locked: the fake records the ranges and checks what the real driver
// documents (a current context; no range registered twice; unregister by the base that was
// registered; CU_MEMHOSTREGISTER_READ_ONLY for a mapping the CPU may not write, refused
// with CUDA_ERROR_NOT_SUPPORTED where the device cannot do it), plus one rule of its own:
// a range must still be mapped when it is unregistered.
//   TENSORD_FAKE_CUDA_NO_READ_ONLY_HOST_REGISTER=1  CU_MEMHOSTREGISTER_READ_ONLY answers
//                                                   CUDA_ERROR_NOT_SUPPORTED (a device
//                                                   without READ_ONLY_HOST_REGISTER_SUPPORTED)

namespace {

constexpr unsigned kKnownHostRegisterFlags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                             CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;

// Registered ranges by base address -> size. Guarded by S().mu.
std::map<uintptr_t, size_t>& HostRegistrations() {
  static auto* ranges = new std::map<uintptr_t, size_t>();
  return *ranges;
}

// Whether [begin, end) is mapped in this process, and whether all of it is writable, from
// /proc/self/maps. False when any byte is not mapped.
bool HostRangeMapped(uintptr_t begin, uintptr_t end, bool* writable) {
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return false;
  *writable = true;
  uintptr_t covered = begin;
  char line[512];
  while (covered < end && std::fgets(line, sizeof(line), maps) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (hi <= covered || lo > covered) continue;  // the file is sorted by address
    if (perms[1] != 'w') *writable = false;
    covered = hi;
  }
  std::fclose(maps);
  return covered >= end;
}

}  // namespace

namespace fake_cuda {

int LiveHostRegistrationsLocked() { return static_cast<int>(HostRegistrations().size()); }

}  // namespace fake_cuda

extern "C" {

CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  FAKE_ENTER("cuMemHostRegister_v2");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (p == nullptr || bytesize == 0 || (Flags & ~kKnownHostRegisterFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  const char* no_read_only = std::getenv("TENSORD_FAKE_CUDA_NO_READ_ONLY_HOST_REGISTER");
  if ((Flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0 && no_read_only != nullptr && std::strcmp(no_read_only, "1") == 0) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = begin + bytesize;
  bool writable = false;
  if (end < begin || !HostRangeMapped(begin, end, &writable)) return CUDA_ERROR_INVALID_VALUE;
  // Pinning pages for a device that may write them needs write access (a guess at the
  // code; cuda.h says READ_ONLY "is required in order to register memory mapped to the CPU
  // as read-only").
  if (!writable && (Flags & CU_MEMHOSTREGISTER_READ_ONLY) == 0) return CUDA_ERROR_NOT_PERMITTED;
  auto& ranges = HostRegistrations();
  auto next = ranges.lower_bound(begin);
  if (next != ranges.end() && next->first < end) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (next != ranges.begin() && std::prev(next)->first + std::prev(next)->second > begin) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  ranges.emplace(begin, bytesize);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostUnregister(void* p) {
  FAKE_ENTER("cuMemHostUnregister");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto& ranges = HostRegistrations();
  auto it = ranges.find(reinterpret_cast<uintptr_t>(p));
  if (it == ranges.end()) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  // Strict on purpose: pages unmapped while pinned mean the caller got the order wrong
  // (unregister, then munmap); the registration then stays counted, as a leak.
  bool writable = false;
  if (!HostRangeMapped(it->first, it->first + it->second, &writable)) return CUDA_ERROR_INVALID_VALUE;
  ranges.erase(it);
  return CUDA_SUCCESS;
}

}  // extern "C"
