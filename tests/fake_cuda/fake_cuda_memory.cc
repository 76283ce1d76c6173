// libtensord_fake_cuda.so: copies between host and device memory and on a stream (at once,
// checked against the mappings' access), memory from cuMemAlloc, what a pointer is, and the
// legacy memory IPC handles (the exporter's pid and memfd number, opened through /proc).
#include "tests/fake_cuda/fake_cuda_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>

using fake_cuda::Current;
using fake_cuda::Linear;
using fake_cuda::NewMemfd;
using fake_cuda::PhysicalOfMemfd;
using fake_cuda::S;
using fake_cuda::kGranularity;

namespace {

constexpr char kIpcMagic[8] = {'T', 'D', 'F', 'A', 'K', 'I', 'P', 'C'};

// The host address behind device range [ptr, ptr + n), or null when it is not all
// accessible memory (for writing, when `write`).
void* HostRange(CUdeviceptr ptr, size_t n, bool write, CUresult* why) {
  auto within = [&](const std::map<uintptr_t, Linear>& m) -> bool {
    auto it = m.upper_bound(ptr);
    if (it == m.begin()) return false;
    --it;
    return ptr >= it->first && ptr + n <= it->first + it->second.size;
  };
  if (within(S().allocs) || within(S().opens)) return reinterpret_cast<void*>(ptr);
  auto it = S().mappings.upper_bound(ptr);
  if (it != S().mappings.begin()) {
    --it;
    if (ptr >= it->first && ptr + n <= it->first + it->second.size) {
      CUmemAccess_flags need = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
      if ((it->second.access & need) == need) return reinterpret_cast<void*>(ptr);
      *why = CUDA_ERROR_ILLEGAL_ADDRESS;
      return nullptr;
    }
  }
  *why = CUDA_ERROR_INVALID_VALUE;
  return nullptr;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  FAKE_ENTER("cuMemcpyHtoD_v2");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  CUresult why = CUDA_SUCCESS;
  void* dst = HostRange(dstDevice, ByteCount, /*write=*/true, &why);
  if (dst == nullptr) return why;
  std::memcpy(dst, srcHost, ByteCount);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  FAKE_ENTER("cuMemcpyDtoH_v2");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  CUresult why = CUDA_SUCCESS;
  void* src = HostRange(srcDevice, ByteCount, /*write=*/false, &why);
  if (src == nullptr) return why;
  std::memcpy(dstHost, src, ByteCount);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  FAKE_ENTER("cuMemsetD32Async");
  (void)hStream;
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  CUresult why = CUDA_SUCCESS;
  auto* dst = static_cast<uint32_t*>(HostRange(dstDevice, N * sizeof(uint32_t), /*write=*/true, &why));
  if (dst == nullptr) return why;
  std::fill(dst, dst + N, ui);
  return CUDA_SUCCESS;
}

// Work on a stream runs at once (streams are not modelled; see "Events").
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream) {
  FAKE_ENTER("cuMemcpyDtoDAsync_v2");
  (void)hStream;
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  CUresult why = CUDA_SUCCESS;
  void* src = HostRange(srcDevice, ByteCount, /*write=*/false, &why);
  if (src == nullptr) return why;
  void* dst = HostRange(dstDevice, ByteCount, /*write=*/true, &why);
  if (dst == nullptr) return why;
  std::memmove(dst, src, ByteCount);
  return CUDA_SUCCESS;
}

// Legacy allocation and IPC. cuMemAlloc_v2, cuMemFree_v2 and cuIpcGetMemHandle are the
// test producer's: CudaDriver does not resolve them.
CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  FAKE_ENTER("cuMemAlloc_v2");
  CUctx_st* ctx = Current();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  size_t size = (bytesize + kGranularity - 1) / kGranularity * kGranularity;
  Linear l;
  l.physical = ctx->physical;
  l.size = size;
  l.fd = NewMemfd(l.physical, size);
  if (l.fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, l.fd, 0);
  if (p == MAP_FAILED) {
    ::close(l.fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  l.serial = S().next_serial++;
  S().allocs[reinterpret_cast<uintptr_t>(p)] = l;
  *dptr = reinterpret_cast<uintptr_t>(p);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  FAKE_ENTER("cuMemFree_v2");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto it = S().allocs.find(dptr);
  if (it == S().allocs.end()) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(reinterpret_cast<void*>(dptr), it->second.size);
  ::close(it->second.fd);
  S().allocs.erase(it);
  return CUDA_SUCCESS;
}

namespace {
// The cuMemAlloc'ed block or opened IPC handle that holds `ptr`, or null.
const std::pair<const uintptr_t, Linear>* LinearHolding(CUdeviceptr ptr) {
  for (const std::map<uintptr_t, Linear>* m : {&S().allocs, &S().opens}) {
    auto it = m->upper_bound(ptr);
    if (it == m->begin()) continue;
    --it;
    if (ptr >= it->first && ptr < it->first + it->second.size) return &*it;
  }
  return nullptr;
}

// This process's ordinal of physical device `physical`, or -1 when it cannot see it.
int OrdinalOfPhysical(int physical) {
  for (size_t i = 0; i < S().visible.size(); ++i) {
    if (S().visible[i] == physical) return static_cast<int>(i);
  }
  return -1;
}
}  // namespace

// Only CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, of cuMemAlloc'ed or IPC-opened memory.
CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  FAKE_ENTER("cuPointerGetAttribute");
  if (data == nullptr || attribute != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) return CUDA_ERROR_INVALID_VALUE;
  const auto* held = LinearHolding(ptr);
  if (held == nullptr) return CUDA_ERROR_INVALID_VALUE;  // as for a host pointer
  const int ordinal = OrdinalOfPhysical(held->second.physical);
  if (ordinal < 0) return CUDA_ERROR_INVALID_DEVICE;
  *static_cast<int*>(data) = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  FAKE_ENTER("cuMemGetAddressRange_v2");
  CUctx_st* ctx = Current();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const auto* held = LinearHolding(dptr);
  if (held == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (held->second.physical != ctx->physical) return CUDA_ERROR_INVALID_CONTEXT;
  if (pbase != nullptr) *pbase = held->first;
  if (psize != nullptr) *psize = held->second.size;
  return CUDA_SUCCESS;
}

namespace {
struct IpcBytes {  // the fake's CUipcMemHandle layout
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t size;
  int32_t physical;
  int32_t pad;
  uint64_t serial;
};
static_assert(sizeof(IpcBytes) <= CU_IPC_HANDLE_SIZE);
}  // namespace

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  FAKE_ENTER("cuIpcGetMemHandle");
  CUctx_st* ctx = Current();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto it = S().allocs.find(dptr);
  if (it == S().allocs.end()) return CUDA_ERROR_INVALID_VALUE;  // not an allocation's base
  if (it->second.physical != ctx->physical) return CUDA_ERROR_INVALID_CONTEXT;
  IpcBytes b{};
  std::memcpy(b.magic, kIpcMagic, sizeof(b.magic));
  b.pid = static_cast<int32_t>(::getpid());
  b.fd = it->second.fd;
  b.size = it->second.size;
  b.physical = it->second.physical;
  b.serial = it->second.serial;
  std::memset(pHandle->reserved, 0, sizeof(pHandle->reserved));
  std::memcpy(pHandle->reserved, &b, sizeof(b));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  FAKE_ENTER("cuIpcOpenMemHandle_v2");
  CUctx_st* ctx = Current();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
  IpcBytes b;
  std::memcpy(&b, handle.reserved, sizeof(b));
  if (std::memcmp(b.magic, kIpcMagic, sizeof(b.magic)) != 0) return CUDA_ERROR_INVALID_HANDLE;
  if (b.pid == ::getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // not in the exporting process
  if (b.physical != ctx->physical) return CUDA_ERROR_INVALID_DEVICE;  // peer access not modelled
  std::string key = std::to_string(b.pid) + "/" + std::to_string(b.fd) + "/" + std::to_string(b.serial);
  for (const auto& [ptr, open] : S().opens) {
    if (open.ipc_key == key) return CUDA_ERROR_ALREADY_MAPPED;
  }
  // Reaching the exporter's memfd through /proc: works while the exporter lives, as with
  // the real thing, where the exporter must outlive every importer.
  std::string path = "/proc/" + std::to_string(b.pid) + "/fd/" + std::to_string(b.fd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  struct stat st;
  if (PhysicalOfMemfd(fd) != b.physical || ::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != b.size) {
    ::close(fd);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  void* p = ::mmap(nullptr, b.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Linear l;
  l.size = b.size;
  l.physical = b.physical;
  l.ipc_key = key;
  S().opens[reinterpret_cast<uintptr_t>(p)] = l;
  *pdptr = reinterpret_cast<uintptr_t>(p);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FAKE_ENTER("cuIpcCloseMemHandle");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto it = S().opens.find(dptr);
  if (it == S().opens.end()) return CUDA_ERROR_INVALID_VALUE;
  ::munmap(reinterpret_cast<void*>(dptr), it->second.size);
  S().opens.erase(it);
  return CUDA_SUCCESS;
}

}  // extern "C"
