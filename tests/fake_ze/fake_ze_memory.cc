// libtensord_fake_ze.so: memory. A device allocation is a memfd mapped shared; its IPC
// handle names that memfd's fd (see fake_ze.h for the bytes), which the receiver gets over
// SCM_RIGHTS, as with Intel's dma-buf fds. A host allocation is anonymous memory.
#include <fcntl.h>
#include <level_zero/ze_ddi.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>

#include "tests/fake_ze/fake_ze.h"

namespace fake_ze {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

UniqueFd NewMemfd(const char* name, size_t length) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC));
  if (fd.get() < 0 || ::ftruncate(fd.get(), static_cast<off_t>(length)) != 0) return UniqueFd();
  return fd;
}

Mapping MapAligned(int fd, size_t length, size_t alignment) {
  const int flags = fd >= 0 ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS;
  if (alignment <= PageSize()) {
    void* addr = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, flags, fd, 0);
    return addr == MAP_FAILED ? Mapping() : Mapping(addr, length);
  }
  // mmap aligns to pages only: reserve room to slide to the alignment, map there, and
  // give back the slack on either side.
  const size_t span = length + alignment;
  void* reserved =
      ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return Mapping();
  const auto start = reinterpret_cast<uintptr_t>(reserved);
  const uintptr_t aligned = RoundUp(start, alignment);
  void* addr = ::mmap(reinterpret_cast<void*>(aligned), length, PROT_READ | PROT_WRITE,
                      flags | MAP_FIXED, fd, 0);
  if (addr == MAP_FAILED) {
    ::munmap(reserved, span);
    return Mapping();
  }
  if (aligned > start) ::munmap(reserved, aligned - start);
  const uintptr_t end = aligned + length;
  if (start + span > end) ::munmap(reinterpret_cast<void*>(end), start + span - end);
  return Mapping(addr, length);
}

bool IsMemfdOfAtLeast(int fd, size_t length) {
  if (fd < 0) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  char target[256];
  const ssize_t n = ::readlink(path, target, sizeof(target) - 1);
  if (n < 0) return false;
  target[n] = '\0';
  static constexpr char kMemfd[] = "/memfd:";
  if (std::strncmp(target, kMemfd, sizeof(kMemfd) - 1) != 0) return false;
  struct stat st;
  return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
         static_cast<uint64_t>(st.st_size) >= length;
}

uint64_t LoadU64(const char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

uint32_t LoadU32(const char* bytes) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

void StoreU64(char* bytes, uint64_t value) {
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

void StoreU32(char* bytes, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

namespace {

// Registers a mapped region under its base address.
void* AddRegion(State& state, std::shared_ptr<Region> region) {
  region->id = state.next_id++;
  void* base = region->base();
  state.regions.emplace(reinterpret_cast<uintptr_t>(base), std::move(region));
  return base;
}

// The region whose base is exactly `ptr`, or nullptr.
std::shared_ptr<Region> RegionAt(const State& state, const void* ptr) {
  auto it = state.regions.find(reinterpret_cast<uintptr_t>(ptr));
  return it == state.regions.end() ? nullptr : it->second;
}

ze_result_t CheckSizeAndAlignment(size_t size, size_t alignment) {
  if (size == 0) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  if ((alignment & (alignment - 1)) != 0) return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  return ZE_RESULT_SUCCESS;
}

}  // namespace

ze_result_t ZE_APICALL zeMemAllocDevice(ze_context_handle_t hContext,
                                        const ze_device_mem_alloc_desc_t* device_desc, size_t size,
                                        size_t alignment, ze_device_handle_t hDevice, void** pptr) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  FAKE_ZE_CHECK_DEVICE(hDevice);
  if (device_desc == nullptr || pptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (device_desc->flags > 0x7) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  // The device has one memory (zeDeviceGetMemoryProperties): ordinal 0.
  if (device_desc->ordinal != 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (ze_result_t r = CheckSizeAndAlignment(size, alignment); r != ZE_RESULT_SUCCESS) return r;
  // As Intel's driver: past maxMemAllocSize (here the whole memory) the size is
  // unsupported; past what is left, the device is out of memory.
  if (size > hDevice->total_memory) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  if (hDevice->used_memory + size > hDevice->total_memory) {
    return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  }
  const size_t length = RoundUp(size, PageSize());
  auto region = std::make_shared<Region>();
  region->fd = NewMemfd("tensord-fake-ze-memory", length);
  if (region->fd.get() < 0) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  region->mapping = MapAligned(region->fd.get(), length, alignment);
  if (!region->mapping) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  region->kind = RegionKind::kDevice;
  region->context = hContext;
  region->device = hDevice;
  region->size = size;
  hDevice->used_memory += size;
  *pptr = AddRegion(state, std::move(region));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeMemAllocHost(ze_context_handle_t hContext,
                                      const ze_host_mem_alloc_desc_t* host_desc, size_t size,
                                      size_t alignment, void** pptr) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  if (host_desc == nullptr || pptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (host_desc->flags > 0xf) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  if (ze_result_t r = CheckSizeAndAlignment(size, alignment); r != ZE_RESULT_SUCCESS) return r;
  if (size > SIZE_MAX - PageSize()) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  auto region = std::make_shared<Region>();
  region->mapping = MapAligned(-1, RoundUp(size, PageSize()), alignment);
  if (!region->mapping) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  region->kind = RegionKind::kHost;
  region->context = hContext;
  region->size = size;
  *pptr = AddRegion(state, std::move(region));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeMemFree(ze_context_handle_t hContext, void* ptr) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  // Allocations of this context only: IPC-opened memory goes back with
  // zeMemCloseIpcHandle, as the spec says.
  std::shared_ptr<Region> region = RegionAt(state, ptr);
  if (region == nullptr || region->kind == RegionKind::kIpcOpen || region->context != hContext) {
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  if (region->kind == RegionKind::kDevice) region->device->used_memory -= region->size;
  state.regions.erase(reinterpret_cast<uintptr_t>(ptr));
  // Unmapped (and the memfd closed) here, or once queued work touching it has run.
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeMemGetAllocProperties(
    ze_context_handle_t hContext, const void* ptr,
    ze_memory_allocation_properties_t* pMemAllocProperties, ze_device_handle_t* phDevice) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  if (ptr == nullptr || pMemAllocProperties == nullptr) {
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  }
  ClearOutput(pMemAllocProperties);
  if (phDevice != nullptr) *phDevice = nullptr;
  // Memory of another context is "unknown", as the spec says.
  std::shared_ptr<Region> region = state.Find(ptr);
  if (region == nullptr || region->context != hContext) {
    pMemAllocProperties->type = ZE_MEMORY_TYPE_UNKNOWN;
    return ZE_RESULT_SUCCESS;
  }
  pMemAllocProperties->type =
      region->kind == RegionKind::kHost ? ZE_MEMORY_TYPE_HOST : ZE_MEMORY_TYPE_DEVICE;
  pMemAllocProperties->id = region->id;
  pMemAllocProperties->pageSize = PageSize();
  if (phDevice != nullptr) *phDevice = region->device;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeMemGetAddressRange(ze_context_handle_t hContext, const void* ptr,
                                            void** pBase, size_t* pSize) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  std::shared_ptr<Region> region = state.Find(ptr);
  // Intel's driver answers UNKNOWN for memory it did not hand out.
  if (region == nullptr || region->context != hContext) return ZE_RESULT_ERROR_UNKNOWN;
  if (pBase != nullptr) *pBase = region->base();
  if (pSize != nullptr) *pSize = region->size;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeMemGetIpcHandle(ze_context_handle_t hContext, const void* ptr,
                                         ze_ipc_mem_handle_t* pIpcHandle) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  if (ptr == nullptr || pIpcHandle == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  // The spec: ptr is the base of a device allocation (of this context).
  std::shared_ptr<Region> region = RegionAt(state, ptr);
  if (region == nullptr || region->kind != RegionKind::kDevice || region->context != hContext) {
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  *pIpcHandle = ze_ipc_mem_handle_t{};
  char* data = pIpcHandle->data;
  StoreU64(data, static_cast<uint64_t>(region->fd.get()));  // ours: the caller must not close it
  StoreU64(data + 8, region->size);
  std::memcpy(data + 16, kMemMagic, sizeof(kMemMagic));
  StoreU32(data + 20, region->device->index);
  StoreU64(data + 24, 0);  // offset: the base, always
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeMemOpenIpcHandle(ze_context_handle_t hContext, ze_device_handle_t hDevice,
                                          ze_ipc_mem_handle_t handle, ze_ipc_memory_flags_t flags,
                                          void** pptr) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  FAKE_ZE_CHECK_DEVICE(hDevice);
  if (pptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (flags > (ZE_IPC_MEMORY_FLAG_BIAS_CACHED | ZE_IPC_MEMORY_FLAG_BIAS_UNCACHED)) {
    return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  }
  const char* data = handle.data;
  const uint64_t fd = LoadU64(data);
  const uint64_t size = LoadU64(data + 8);
  // Strict on purpose: the handle must name the device it is opened on (UUIDs map the
  // exporter's device to the importer's), and its fd must be a memfd of the size.
  if (std::memcmp(data + 16, kMemMagic, sizeof(kMemMagic)) != 0 ||
      LoadU32(data + 20) != hDevice->index || LoadU64(data + 24) != 0 || size == 0 ||
      size > SIZE_MAX - PageSize() || fd > INT_MAX ||
      !IsMemfdOfAtLeast(static_cast<int>(fd), size)) {
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  // Every open maps again, as with the real driver; the caller may close its fd after.
  auto region = std::make_shared<Region>();
  region->mapping = MapAligned(static_cast<int>(fd), RoundUp(size, PageSize()), 0);
  if (!region->mapping) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  region->kind = RegionKind::kIpcOpen;
  region->context = hContext;
  region->device = hDevice;
  region->size = size;
  *pptr = AddRegion(state, std::move(region));
  ++state.ipc_opens_total;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeMemCloseIpcHandle(ze_context_handle_t hContext, const void* ptr) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  std::shared_ptr<Region> region = RegionAt(state, ptr);
  if (region == nullptr || region->kind != RegionKind::kIpcOpen || region->context != hContext) {
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  state.regions.erase(reinterpret_cast<uintptr_t>(ptr));
  return ZE_RESULT_SUCCESS;
}

}  // namespace fake_ze

extern "C" ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetMemProcAddrTable(ze_api_version_t version,
                                                                     ze_mem_dditable_t* pDdiTable) {
  if (ze_result_t r = fake_ze::StartTable(version, pDdiTable); r != ZE_RESULT_SUCCESS) return r;
  pDdiTable->pfnAllocDevice = fake_ze::zeMemAllocDevice;
  pDdiTable->pfnAllocHost = fake_ze::zeMemAllocHost;
  pDdiTable->pfnFree = fake_ze::zeMemFree;
  pDdiTable->pfnGetAllocProperties = fake_ze::zeMemGetAllocProperties;
  pDdiTable->pfnGetAddressRange = fake_ze::zeMemGetAddressRange;
  pDdiTable->pfnGetIpcHandle = fake_ze::zeMemGetIpcHandle;
  pDdiTable->pfnOpenIpcHandle = fake_ze::zeMemOpenIpcHandle;
  pDdiTable->pfnCloseIpcHandle = fake_ze::zeMemCloseIpcHandle;
  return ZE_RESULT_SUCCESS;
}
