// libtensord_fake_cuda.so: the virtual memory management entry points. An allocation is a
// memfd of whole 2 MiB granules; its shareable handle is a dup of the memfd; a reservation is
// PROT_NONE address space; cuMemMap maps the memfd there, and cuMemSetAccess mprotects it.
#include "tests/fake_cuda/fake_cuda_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <iterator>
#include <vector>

using fake_cuda::Allocation;
using fake_cuda::Mapping;
using fake_cuda::NewMemfd;
using fake_cuda::PhysicalOfMemfd;
using fake_cuda::S;
using fake_cuda::ValidOrdinal;
using fake_cuda::kGranularity;
using fake_cuda::kTotalMem;

namespace {

int ProtOf(CUmemAccess_flags access) {
  switch (access) {
    case CU_MEM_ACCESS_FLAGS_PROT_READ:
      return PROT_READ;
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
      return PROT_READ | PROT_WRITE;
    default:
      return PROT_NONE;
  }
}

CUresult CheckProp(const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!ValidOrdinal(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  FAKE_ENTER("cuMemGetAllocationGranularity");
  if (CUresult r = CheckProp(prop); r != CUDA_SUCCESS) return r;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  FAKE_ENTER("cuMemCreate");
  if (CUresult r = CheckProp(prop); r != CUDA_SUCCESS) return r;
  if (flags != 0 || size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if (size > kTotalMem) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.physical = S().visible[prop->location.id];
  a.fd = NewMemfd(a.physical, size);
  if (a.fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  a.size = size;
  a.handle_types = prop->requestedHandleTypes;
  *handle = S().next_handle++;
  S().allocations[*handle] = a;
  return CUDA_SUCCESS;
}

namespace {
void DropAllocationIfUnused(unsigned long long id) {
  auto it = S().allocations.find(id);
  if (it != S().allocations.end() && !it->second.handle_live && it->second.mappings == 0) {
    ::close(it->second.fd);
    S().allocations.erase(it);
  }
}
}  // namespace

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKE_ENTER("cuMemRelease");
  auto it = S().allocations.find(handle);
  if (it == S().allocations.end() || !it->second.handle_live) return CUDA_ERROR_INVALID_VALUE;
  it->second.handle_live = false;
  DropAllocationIfUnused(handle);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType, unsigned long long flags) {
  FAKE_ENTER("cuMemExportToShareableHandle");
  auto it = S().allocations.find(handle);
  if (it == S().allocations.end() || !it->second.handle_live || flags != 0 || shareableHandle == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      (it->second.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  int fd = ::fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareableHandle) = fd;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                                CUmemAllocationHandleType shHandleType) {
  FAKE_ENTER("cuMemImportFromShareableHandle");
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = static_cast<int>(reinterpret_cast<uintptr_t>(osHandle));
  int physical = PhysicalOfMemfd(fd);
  struct stat st;
  if (physical < 0 || ::fstat(fd, &st) != 0 || st.st_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  bool visible = false;
  for (int v : S().visible) visible |= (v == physical);
  if (!visible) return CUDA_ERROR_INVALID_DEVICE;
  Allocation a;
  a.fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (a.fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  a.size = static_cast<size_t>(st.st_size);
  a.physical = physical;
  a.handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  *handle = S().next_handle++;
  S().allocations[*handle] = a;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
  FAKE_ENTER("cuMemAddressReserve");
  (void)addr;  // a hint
  if (size == 0 || size % kGranularity != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment == 0) alignment = kGranularity;
  if ((alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  void* raw = ::mmap(nullptr, size + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t base = (reinterpret_cast<uintptr_t>(raw) + alignment - 1) & ~(alignment - 1);
  if (base > reinterpret_cast<uintptr_t>(raw)) ::munmap(raw, base - reinterpret_cast<uintptr_t>(raw));
  uintptr_t end = reinterpret_cast<uintptr_t>(raw) + size + alignment;
  if (end > base + size) ::munmap(reinterpret_cast<void*>(base + size), end - (base + size));
  S().reservations[base] = size;
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemAddressFree");
  auto it = S().reservations.find(ptr);
  if (it == S().reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = S().mappings.lower_bound(ptr);
  if (m != S().mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;  // still mapped
  ::munmap(reinterpret_cast<void*>(ptr), size);
  S().reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  FAKE_ENTER("cuMemMap");
  auto a = S().allocations.find(handle);
  if (a == S().allocations.end() || !a->second.handle_live || flags != 0) return CUDA_ERROR_INVALID_HANDLE;
  if (size == 0 || size % kGranularity != 0 || offset % kGranularity != 0 || offset + size > a->second.size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto r = S().reservations.upper_bound(ptr);
  if (r == S().reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --r;
  if (ptr < r->first || ptr + size > r->first + r->second) return CUDA_ERROR_INVALID_VALUE;
  auto m = S().mappings.lower_bound(ptr);
  if (m != S().mappings.end() && m->first < ptr + size) return CUDA_ERROR_ALREADY_MAPPED;
  if (m != S().mappings.begin() && std::prev(m)->first + std::prev(m)->second.size > ptr) {
    return CUDA_ERROR_ALREADY_MAPPED;
  }
  void* got = ::mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->second.fd,
                     static_cast<off_t>(offset));
  if (got == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  S().mappings[ptr] = Mapping{size, handle, CU_MEM_ACCESS_FLAGS_PROT_NONE};
  ++a->second.mappings;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemUnmap");
  auto m = S().mappings.find(ptr);
  if (m == S().mappings.end() || m->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  // Back to a bare reservation.
  ::mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
  unsigned long long id = m->second.allocation;
  S().mappings.erase(m);
  --S().allocations[id].mappings;
  DropAllocationIfUnused(id);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  FAKE_ENTER("cuMemSetAccess");
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  // The range must be whole mappings, back to back.
  std::vector<Mapping*> covered;
  CUdeviceptr at = ptr;
  while (at < ptr + size) {
    auto m = S().mappings.find(at);
    if (m == S().mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    covered.push_back(&m->second);
    at += m->second.size;
  }
  if (at != ptr + size || covered.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!ValidOrdinal(desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
    for (Mapping* m : covered) {
      // Peer access is not modelled: only the allocation's own device may be named.
      if (S().allocations[m->allocation].physical != S().visible[desc[i].location.id]) {
        return CUDA_ERROR_INVALID_DEVICE;
      }
    }
    CUmemAccess_flags f = desc[i].flags;
    if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (f == CU_MEM_ACCESS_FLAGS_PROT_READ && S().no_read_only) return CUDA_ERROR_INVALID_VALUE;
  }
  CUmemAccess_flags f = desc[count - 1].flags;
  if (::mprotect(reinterpret_cast<void*>(ptr), size, ProtOf(f)) != 0) return CUDA_ERROR_UNKNOWN;
  for (Mapping* m : covered) m->access = f;
  return CUDA_SUCCESS;
}

}  // extern "C"
