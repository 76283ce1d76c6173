// libtensord_fake_cuda.so: a SOFTWARE STAND-IN for libcuda.so.1, for tests only. It
// proves tensord's plumbing (dlopen table, handle encoding, fd passing, UUID -> ordinal
// mapping, reserve/map/access/unmap ordering, refcounted IPC opens, cleanup) on machines
// without a GPU. It proves nothing about NVIDIA hardware or the real driver's behaviour:
// "device memory" is host memory in memfds. See README.md beside it.
//
// It implements exactly the entry points CudaDriver resolves (common/memory/cuda/
// cuda_driver.h), plus what a test producer needs (cuMemAlloc_v2, cuMemFree_v2) and
// test-only queries (tensord_fake_cuda_*), looked up with dlsym.
//
// Environment (read at cuInit):
//   TENSORD_FAKE_CUDA_DEVICES=N        physical devices (default 1; 0: cuInit answers
//                                      CUDA_ERROR_NO_DEVICE)
//   CUDA_VISIBLE_DEVICES=a,b,...       as the real driver: ordinals or GPU-<uuid prefix>;
//                                      the list stops at the first entry that names no
//                                      device; set but empty hides every device
//   TENSORD_FAKE_CUDA_NO_READ_ONLY=1   cuMemSetAccess refuses CU_MEM_ACCESS_FLAGS_PROT_READ
//                                      with CUDA_ERROR_INVALID_VALUE (a driver that cannot
//                                      map read-only)
//
// Modelled strictly, to catch ordering bugs: VMM calls and cuPointerGetAttribute need no
// context, legacy IPC, cuMemGetAddressRange and copies need a current one (for
// cuMemGetAddressRange and cuIpcGetMemHandle, one on the memory's device); cuMemSetAccess
// must name the allocation's own device (no peer access); cuMemAddressFree of a range that
// is still mapped fails; a second
// cuIpcOpenMemHandle of one allocation in one process answers CUDA_ERROR_ALREADY_MAPPED;
// opening a handle in its exporting process fails. Copies into a read-only mapping answer
// CUDA_ERROR_ILLEGAL_ADDRESS instead of faulting.
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

struct CUctx_st {
  int ordinal = 0;
  int physical = 0;
  int retains = 0;
};

// An event: a slot in a process's event table (see "Events" below). An imported one
// reads and writes the exporter's table through a shared mapping of it.
struct CUevent_st {
  unsigned int flags = 0;
  uint32_t slot = 0;
  uint64_t serial = 0;
  int exporter_pid = 0;          // 0: this process's own event
  volatile uint32_t* table = nullptr;  // the slot states this event lives in
};

namespace {

constexpr size_t kGranularity = 2u << 20;
constexpr int kMaxDevices = 16;
constexpr char kMemfdPrefix[] = "tensord-fake-cuda:";
constexpr char kIpcMagic[8] = {'T', 'D', 'F', 'A', 'K', 'I', 'P', 'C'};
constexpr uint64_t kTotalMem = 16ull << 30;

struct Allocation {
  int fd = -1;
  size_t size = 0;
  int physical = 0;
  unsigned long long handle_types = 0;
  bool handle_live = true;  // false once cuMemRelease'd; mappings may keep it
  int mappings = 0;
};

struct Mapping {
  size_t size = 0;
  unsigned long long allocation = 0;
  CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
};

struct Linear {  // cuMemAlloc'ed memory or an opened IPC handle: mapped read-write
  int fd = -1;
  size_t size = 0;
  int physical = 0;
  uint64_t serial = 0;
  std::string ipc_key;  // opened IPC handle: exporter pid, fd and serial
};

struct State {
  std::mutex mu;
  bool initialized = false;
  int physical_count = 0;
  std::vector<int> visible;  // physical device by ordinal
  bool no_read_only = false;
  CUctx_st contexts[kMaxDevices];
  unsigned long long next_handle = 1;
  uint64_t next_serial = 1;
  std::map<unsigned long long, Allocation> allocations;
  std::map<uintptr_t, size_t> reservations;
  std::map<uintptr_t, Mapping> mappings;
  std::map<uintptr_t, Linear> allocs;  // cuMemAlloc
  std::map<uintptr_t, Linear> opens;   // cuIpcOpenMemHandle
  std::map<std::string, CUresult> fail_next;
  std::map<std::string, int> calls;  // entry point -> calls in this process (tensord_fake_cuda_calls)
  // Events (see "Events" below).
  int event_table_fd = -1;
  volatile uint32_t* event_table = nullptr;
  std::vector<uint32_t> free_slots;
  uint32_t next_slot = 0;
  int live_events = 0;
  bool hold_streams = false;
  struct Wait {
    uintptr_t stream;
    int exporter_pid;
    uint32_t slot;
    bool pending;
  };
  std::vector<Wait> waits;
};

State& S() {
  static State* state = new State();
  return *state;
}

thread_local std::vector<CUcontext> t_context_stack;

std::string UuidBytes(int physical) {
  const unsigned char b[16] = {0x8a, 0x3f, 0x1c, 0x5e, 0x22, 0x41, 0x4b, 0x7d,
                               0x9c, 0x0e, 0x6f, 0x13, 0x55, 0xa2, 0x00, static_cast<unsigned char>(physical)};
  return std::string(reinterpret_cast<const char*>(b), 16);
}

std::string UuidText(int physical) {
  std::string bytes = UuidBytes(physical);
  static const char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[static_cast<unsigned char>(bytes[i]) >> 4];
    out += kHex[static_cast<unsigned char>(bytes[i]) & 0xf];
  }
  return out;
}

// One CUDA_VISIBLE_DEVICES entry -> physical device, or -1.
int ParseVisibleEntry(std::string entry, int physical_count) {
  while (!entry.empty() && entry.front() == ' ') entry.erase(entry.begin());
  while (!entry.empty() && entry.back() == ' ') entry.pop_back();
  if (entry.empty()) return -1;
  if (entry.rfind("GPU-", 0) == 0) {
    int match = -1;
    for (int p = 0; p < physical_count; ++p) {
      if (UuidText(p).rfind(entry, 0) == 0) {
        if (match >= 0) return -1;  // an ambiguous prefix names no device
        match = p;
      }
    }
    return match;
  }
  char* end = nullptr;
  long ordinal = std::strtol(entry.c_str(), &end, 10);
  if (*end != '\0' || ordinal < 0 || ordinal >= physical_count) return -1;
  return static_cast<int>(ordinal);
}

bool Initialized() { return S().initialized; }

bool ValidOrdinal(int ordinal) { return ordinal >= 0 && ordinal < static_cast<int>(S().visible.size()); }

CUresult Injected(const char* name) {
  ++S().calls[name];
  auto it = S().fail_next.find(name);
  if (it == S().fail_next.end()) return CUDA_SUCCESS;
  CUresult r = it->second;
  S().fail_next.erase(it);
  return r;
}

#define FAKE_ENTER(name)                                     \
  std::lock_guard<std::mutex> lock(S().mu);                  \
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;     \
  if (CUresult injected = Injected(name); injected != CUDA_SUCCESS) return injected

CUctx_st* Current() { return t_context_stack.empty() ? nullptr : t_context_stack.back(); }

int PhysicalOfMemfd(int fd) {
  char link[64];
  char target[256];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = ::readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return -1;
  target[n] = '\0';
  const char* at = std::strstr(target, kMemfdPrefix);
  if (at == nullptr) return -1;
  return std::atoi(at + sizeof(kMemfdPrefix) - 1);
}

int NewMemfd(int physical, size_t size) {
  std::string name = kMemfdPrefix + std::to_string(physical);
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

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

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  switch (error) {
#define FAKE_NAME(e) \
  case e:            \
    *pStr = #e;      \
    return CUDA_SUCCESS;
    FAKE_NAME(CUDA_SUCCESS)
    FAKE_NAME(CUDA_ERROR_INVALID_VALUE)
    FAKE_NAME(CUDA_ERROR_OUT_OF_MEMORY)
    FAKE_NAME(CUDA_ERROR_NOT_INITIALIZED)
    FAKE_NAME(CUDA_ERROR_NO_DEVICE)
    FAKE_NAME(CUDA_ERROR_INVALID_DEVICE)
    FAKE_NAME(CUDA_ERROR_INVALID_CONTEXT)
    FAKE_NAME(CUDA_ERROR_ALREADY_MAPPED)
    FAKE_NAME(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
    FAKE_NAME(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
    FAKE_NAME(CUDA_ERROR_INVALID_HANDLE)
    FAKE_NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
    FAKE_NAME(CUDA_ERROR_NOT_PERMITTED)
    FAKE_NAME(CUDA_ERROR_NOT_SUPPORTED)
    FAKE_NAME(CUDA_ERROR_NOT_FOUND)
    FAKE_NAME(CUDA_ERROR_UNKNOWN)
#undef FAKE_NAME
    default:
      *pStr = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  switch (error) {
    case CUDA_SUCCESS: *pStr = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *pStr = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *pStr = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *pStr = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: *pStr = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_DEVICE: *pStr = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *pStr = "invalid device context"; break;
    case CUDA_ERROR_ALREADY_MAPPED: *pStr = "resource already mapped"; break;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: *pStr = "part or all of the requested memory range is already mapped"; break;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: *pStr = "pointer does not correspond to a registered memory region"; break;
    case CUDA_ERROR_INVALID_HANDLE: *pStr = "invalid resource handle"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *pStr = "an illegal memory access was encountered"; break;
    case CUDA_ERROR_NOT_PERMITTED: *pStr = "operation not permitted"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *pStr = "operation not supported"; break;
    case CUDA_ERROR_NOT_FOUND: *pStr = "named symbol not found"; break;
    case CUDA_ERROR_UNKNOWN: *pStr = "unknown error"; break;
    default: *pStr = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (S().initialized) return CUDA_SUCCESS;
  const char* devices = std::getenv("TENSORD_FAKE_CUDA_DEVICES");
  int count = devices != nullptr ? std::atoi(devices) : 1;
  if (count < 0) count = 0;
  if (count > kMaxDevices) count = kMaxDevices;
  S().physical_count = count;
  S().visible.clear();
  if (const char* list = std::getenv("CUDA_VISIBLE_DEVICES"); list != nullptr) {
    // Set but empty hides every device.
    std::string rest = list;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      int physical = ParseVisibleEntry(rest.substr(0, comma), count);
      bool duplicate = false;
      for (int v : S().visible) duplicate |= (v == physical);
      if (physical < 0 || duplicate) break;  // the real driver stops at the first bad entry
      S().visible.push_back(physical);
      rest = comma == std::string::npos ? std::string() : rest.substr(comma + 1);
    }
  } else {
    for (int p = 0; p < count; ++p) S().visible.push_back(p);
  }
  if (S().visible.empty()) return CUDA_ERROR_NO_DEVICE;
  const char* no_read_only = std::getenv("TENSORD_FAKE_CUDA_NO_READ_ONLY");
  S().no_read_only = no_read_only != nullptr && std::strcmp(no_read_only, "1") == 0;
  for (size_t i = 0; i < S().visible.size(); ++i) {
    S().contexts[i].ordinal = static_cast<int>(i);
    S().contexts[i].physical = S().visible[i];
  }
  S().initialized = true;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  FAKE_ENTER("cuDeviceGetCount");
  *count = static_cast<int>(S().visible.size());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  FAKE_ENTER("cuDeviceGet");
  if (!ValidOrdinal(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetName");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "tensord fake CUDA device %d", S().visible[dev]);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetUuid_v2");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::memcpy(uuid->bytes, UuidBytes(S().visible[dev]).data(), 16);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  FAKE_ENTER("cuDeviceTotalMem_v2");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = kTotalMem;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetAttribute");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *pi = 1;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;  // the fake models no other attribute
  }
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRetain");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  ++S().contexts[dev].retains;
  *pctx = &S().contexts[dev];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRelease_v2");
  if (!ValidOrdinal(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (S().contexts[dev].retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --S().contexts[dev].retains;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  FAKE_ENTER("cuCtxPushCurrent_v2");
  if (ctx == nullptr || ctx->retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
  t_context_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  FAKE_ENTER("cuCtxPopCurrent_v2");
  if (t_context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = t_context_stack.back();
  t_context_stack.pop_back();
  return CUDA_SUCCESS;
}

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

// Streams for test programs (CudaDriver resolves none of these): handles only, since work
// on a stream runs at once (see "Events").
CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  FAKE_ENTER("cuStreamCreate");
  (void)Flags;
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *phStream = reinterpret_cast<CUstream>(static_cast<uintptr_t>(0x100000 + S().next_serial++));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  FAKE_ENTER("cuStreamSynchronize");
  (void)hStream;
  return Current() == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
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

// Pinned host memory: the section at the end of this file. Called with S().mu held.
static int LiveHostRegistrationsLocked();
// ---- Events ----
//
// Streams are not modelled: work "runs" when it is enqueued, so an event is complete as
// soon as it is recorded, unless a test holds the streams (tensord_fake_cuda_hold_streams):
// then a recorded event stays pending until tensord_fake_cuda_finish_streams() completes
// every pending event of this process, as a GPU finishing its queued work would.
// Each process keeps its events' states in a memfd (one uint32 per slot: 0 complete or
// never recorded, 1 pending); an IPC event handle carries the exporter's pid, that memfd's
// fd number, the slot and a serial, and cuIpcOpenEventHandle maps the table through
// /proc/PID/fd/N, so a consumer's wait sees the producer's event state. cuStreamWaitEvent
// enqueues nothing: it logs (stream, exporter, slot, pending) for the test queries.
// Strict like the real driver: events need a current context; cuIpcGetEventHandle needs
// CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING; opening an event handle in its own
// process fails; cuStreamWaitEvent takes flags 0 only.

namespace {
constexpr uint32_t kEventSlots = 4096;
constexpr char kEventMagic[8] = {'T', 'D', 'F', 'A', 'K', 'E', 'V', 'T'};
struct EventIpcBytes {  // the fake's CUipcEventHandle layout
  char magic[8];
  int32_t pid;
  int32_t table_fd;
  uint32_t slot;
  uint32_t pad;
  uint64_t serial;
};
static_assert(sizeof(EventIpcBytes) <= CU_IPC_HANDLE_SIZE);

CUresult EnsureEventTable() {
  if (S().event_table != nullptr) return CUDA_SUCCESS;
  int fd = ::memfd_create("tensord-fake-cuda-events", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (::ftruncate(fd, kEventSlots * sizeof(uint32_t)) != 0) {
    ::close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* p = ::mmap(nullptr, kEventSlots * sizeof(uint32_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  S().event_table_fd = fd;
  S().event_table = static_cast<volatile uint32_t*>(p);
  return CUDA_SUCCESS;
}
}  // namespace

CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  FAKE_ENTER("cuEventCreate");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = EnsureEventTable(); r != CUDA_SUCCESS) return r;
  uint32_t slot;
  if (!S().free_slots.empty()) {
    slot = S().free_slots.back();
    S().free_slots.pop_back();
  } else if (S().next_slot < kEventSlots) {
    slot = S().next_slot++;
  } else {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  S().event_table[slot] = 0;
  auto* ev = new CUevent_st();
  ev->flags = Flags;
  ev->slot = slot;
  ev->serial = S().next_serial++;
  ev->table = S().event_table;
  ++S().live_events;
  *phEvent = ev;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  FAKE_ENTER("cuEventRecord");
  (void)hStream;
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (hEvent == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  hEvent->table[hEvent->slot] = S().hold_streams ? 1u : 0u;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  FAKE_ENTER("cuEventQuery");
  if (hEvent == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return hEvent->table[hEvent->slot] == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  {
    FAKE_ENTER("cuEventSynchronize");
    if (hEvent == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  }
  // Held work finishes when the test says so: wait for it (without the lock), at most 30 s.
  for (int i = 0; i < 30000; ++i) {
    if (hEvent->table[hEvent->slot] == 0) return CUDA_SUCCESS;
    ::usleep(1000);
  }
  return CUDA_ERROR_LAUNCH_TIMEOUT;
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  FAKE_ENTER("cuEventDestroy_v2");
  if (hEvent == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (hEvent->exporter_pid != 0) {
    ::munmap(const_cast<uint32_t*>(hEvent->table), kEventSlots * sizeof(uint32_t));
  } else {
    hEvent->table[hEvent->slot] = 0;
    S().free_slots.push_back(hEvent->slot);
  }
  delete hEvent;
  --S().live_events;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle* pHandle, CUevent event) {
  FAKE_ENTER("cuIpcGetEventHandle");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (pHandle == nullptr || event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned int needed = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
  if ((event->flags & needed) != needed || event->exporter_pid != 0) return CUDA_ERROR_INVALID_VALUE;
  EventIpcBytes b{};
  std::memcpy(b.magic, kEventMagic, sizeof(b.magic));
  b.pid = static_cast<int32_t>(::getpid());
  b.table_fd = S().event_table_fd;
  b.slot = event->slot;
  b.serial = event->serial;
  std::memset(pHandle->reserved, 0, sizeof(pHandle->reserved));
  std::memcpy(pHandle->reserved, &b, sizeof(b));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcOpenEventHandle(CUevent* phEvent, CUipcEventHandle handle) {
  FAKE_ENTER("cuIpcOpenEventHandle");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
  EventIpcBytes b;
  std::memcpy(&b, handle.reserved, sizeof(b));
  if (std::memcmp(b.magic, kEventMagic, sizeof(b.magic)) != 0 || b.slot >= kEventSlots) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (b.pid == ::getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // not in the exporting process
  std::string path = "/proc/" + std::to_string(b.pid) + "/fd/" + std::to_string(b.table_fd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the exporter is gone
  void* p = ::mmap(nullptr, kEventSlots * sizeof(uint32_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_INVALID_HANDLE;
  auto* ev = new CUevent_st();
  ev->flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
  ev->slot = b.slot;
  ev->serial = b.serial;
  ev->exporter_pid = b.pid;
  ev->table = static_cast<volatile uint32_t*>(p);
  ++S().live_events;
  *phEvent = ev;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  FAKE_ENTER("cuStreamWaitEvent");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (hEvent == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  S().waits.push_back({reinterpret_cast<uintptr_t>(hStream), hEvent->exporter_pid, hEvent->slot,
                       hEvent->table[hEvent->slot] != 0});
  return CUDA_SUCCESS;
}

// ---- Test-only queries ----

// Objects the fake holds for this process: live allocations (handles, or released ones
// still mapped), address reservations, mappings, cuMemAlloc'ed blocks and open IPC
// handles, host ranges registered with cuMemHostRegister, events (created or opened).
// `kind` null: all of them; else one of "allocation", "reservation", "mapping", "alloc",
// "ipc_open", "host_register", "event" (-1 for anything else).
__attribute__((visibility("default"))) int tensord_fake_cuda_live_objects(const char* kind) {
  std::lock_guard<std::mutex> lock(S().mu);
  auto n = [](size_t v) { return static_cast<int>(v); };
  if (kind == nullptr) {
    return n(S().allocations.size() + S().reservations.size() + S().mappings.size() + S().allocs.size() +
             S().opens.size()) + LiveHostRegistrationsLocked() + S().live_events;
  }
  std::string k = kind;
  if (k == "allocation") return n(S().allocations.size());
  if (k == "reservation") return n(S().reservations.size());
  if (k == "mapping") return n(S().mappings.size());
  if (k == "alloc") return n(S().allocs.size());
  if (k == "ipc_open") return n(S().opens.size());
  if (k == "host_register") return LiveHostRegistrationsLocked();
  if (k == "event") return S().live_events;
  return -1;
}

// How many times ordinal `ordinal`'s primary context is retained now (-1: no such device).
__attribute__((visibility("default"))) int tensord_fake_cuda_primary_context_retains(int ordinal) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (!ValidOrdinal(ordinal)) return -1;
  return S().contexts[ordinal].retains;
}

// How many times this process called entry point `symbol` (its exported name) after its
// cuInit, counting calls that failed too; 0 for one never called.
__attribute__((visibility("default"))) int tensord_fake_cuda_calls(const char* symbol) {
  std::lock_guard<std::mutex> lock(S().mu);
  auto it = S().calls.find(symbol);
  return it == S().calls.end() ? 0 : it->second;
}

// The next call of entry point `symbol` (its exported name) answers `result`.
__attribute__((visibility("default"))) void tensord_fake_cuda_fail_next(const char* symbol, int result) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().fail_next[symbol] = static_cast<CUresult>(result);
}

// While `hold` is non-zero, events this process records stay pending (its streams' work
// has not run) until tensord_fake_cuda_finish_streams().
__attribute__((visibility("default"))) void tensord_fake_cuda_hold_streams(int hold) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().hold_streams = hold != 0;
}

// Completes every pending event of this process; returns how many were pending.
__attribute__((visibility("default"))) int tensord_fake_cuda_finish_streams() {
  std::lock_guard<std::mutex> lock(S().mu);
  int finished = 0;
  for (uint32_t slot = 0; S().event_table != nullptr && slot < S().next_slot; ++slot) {
    if (S().event_table[slot] != 0) {
      S().event_table[slot] = 0;
      ++finished;
    }
  }
  return finished;
}

// How many cuStreamWaitEvent calls made `stream` wait on an event exported by process
// `exporter_pid` (0: this process's own events; -1: any), counting only waits on an event
// that was still pending when `pending_only` is non-zero.
__attribute__((visibility("default"))) int tensord_fake_cuda_stream_waits(uintptr_t stream, int exporter_pid,
                                                                          int pending_only) {
  std::lock_guard<std::mutex> lock(S().mu);
  int n = 0;
  for (const State::Wait& w : S().waits) {
    if (w.stream != stream) continue;
    if (exporter_pid != -1 && w.exporter_pid != exporter_pid) continue;
    if (pending_only != 0 && !w.pending) continue;
    ++n;
  }
  return n;
}

}  // extern "C"

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

extern "C" {

static int LiveHostRegistrationsLocked() { return static_cast<int>(HostRegistrations().size()); }

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
