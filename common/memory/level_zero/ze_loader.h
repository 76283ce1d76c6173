// ZeLoader: the Level Zero API through the loader (libze_loader.so.1), loaded at run time
// into a table of entry points, so one build runs on machines with and without an Intel
// GPU. Nothing links the loader; the build needs only Debian's libze-dev headers (API 1.4).
//
// ZeLoader::Get() loads it once per process (thread-safe, never fails): dlopen of
// "libze_loader.so.1" (RTLD_NOW|RTLD_LOCAL), dlsym of exactly the entry points below,
// zeInit(ZE_INIT_FLAG_GPU_ONLY), then every driver's devices. Any step that fails leaves
// the loader unavailable, with unavailable_reason() saying which step and why; the entry
// points are then null and must not be called. The environment variable
// TENSORD_LIBZE_LOADER names another loader library to load instead (a test hook, read
// once); the loader itself honours ZE_ENABLE_ALT_DRIVERS, which is how the tests load
// tests/fake_ze's software driver through the real loader.
//
// Newer API (1.6+) that Debian's 1.4 headers lack is resolved when the loader exports it,
// with this file's own declarations (optional entry points, null when absent):
// zeMemPutIpcHandle, zeMemGetFileDescriptorFromIpcHandleExp and
// zeMemGetIpcHandleFromFileDescriptorExp. Without them the fd inside an IPC handle is read
// from and written into the handle's bytes where Intel's driver lays it out (ze_handle.h).
//
// Devices: every device of every driver, in the loader's order; a device's ordinal is its
// index in that list, the same in every process that sees the same devices, and what
// DLPack's kDLOneAPI device_id names here (docs/memory-backends.md). Devices are named
// across processes by ze_device_properties_t::uuid.
//
// Thread-safety: immutable after Get() returns. Level Zero handles are thread-safe where
// its spec says so; command lists are not (callers own theirs).
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tensord::common {

// X(symbol): every entry point ZeLoader requires, by the name the loader exports.
#define TENSORD_ZE_LOADER_ENTRY_POINTS(X) \
  X(zeInit)                               \
  X(zeDriverGet)                          \
  X(zeDriverGetIpcProperties)             \
  X(zeDeviceGet)                          \
  X(zeDeviceGetProperties)                \
  X(zeDeviceGetMemoryProperties)          \
  X(zeContextCreate)                      \
  X(zeContextDestroy)                     \
  X(zeMemAllocDevice)                     \
  X(zeMemFree)                            \
  X(zeMemGetAllocProperties)              \
  X(zeMemGetAddressRange)                 \
  X(zeMemGetIpcHandle)                    \
  X(zeMemOpenIpcHandle)                   \
  X(zeMemCloseIpcHandle)                  \
  X(zeEventPoolCreate)                    \
  X(zeEventPoolDestroy)                   \
  X(zeEventPoolGetIpcHandle)              \
  X(zeEventPoolOpenIpcHandle)             \
  X(zeEventPoolCloseIpcHandle)            \
  X(zeEventCreate)                        \
  X(zeEventDestroy)                       \
  X(zeEventHostSignal)                    \
  X(zeEventHostSynchronize)               \
  X(zeEventQueryStatus)                   \
  X(zeEventHostReset)                     \
  X(zeCommandListCreateImmediate)         \
  X(zeCommandListDestroy)                 \
  X(zeCommandListAppendMemoryCopy)        \
  X(zeCommandListAppendSignalEvent)       \
  X(zeCommandListAppendWaitOnEvents)      \
  X(zeCommandListAppendEventReset)

// The 1.6+ entry points, declared here because the 1.4 headers do not.
using ZeMemPutIpcHandleFn = ze_result_t (*)(ze_context_handle_t, ze_ipc_mem_handle_t);
using ZeMemGetFileDescriptorFromIpcHandleExpFn = ze_result_t (*)(ze_context_handle_t, ze_ipc_mem_handle_t,
                                                                 uint64_t*);
using ZeMemGetIpcHandleFromFileDescriptorExpFn = ze_result_t (*)(ze_context_handle_t, uint64_t,
                                                                 ze_ipc_mem_handle_t*);

// How many devices a process can see at most; more are left out (logged).
inline constexpr int kMaxZeDevices = 64;

// One device as this process sees it.
struct ZeDevice {
  int32_t ordinal = 0;  // index in ZeLoader::devices(): DLPack's device_id
  ze_driver_handle_t driver = nullptr;
  ze_device_handle_t device = nullptr;
  std::string uuid;  // 16 raw bytes
  std::string name;
  uint64_t total_bytes = 0;  // summed memory properties; 0 when unknown
};

class ZeLoader {
 public:
  // The process's loader, loaded on the first call. Never null.
  static const ZeLoader& Get();

  ZeLoader(const ZeLoader&) = delete;
  ZeLoader& operator=(const ZeLoader&) = delete;

  bool available() const { return unavailable_reason_.empty(); }
  // Empty when available; else what failed, e.g. "libze_loader.so.1 not found (dlopen:
  // ...)", "no Level Zero GPU: zeInit: ZE_RESULT_ERROR_UNINITIALIZED", "no Level Zero
  // device: the drivers report none".
  const std::string& unavailable_reason() const { return unavailable_reason_; }
  const std::string& library() const { return library_; }

  // OK for ZE_RESULT_SUCCESS; else "<what>: ZE_RESULT_ERROR_X" with the code that fits:
  // OUT_OF_*_MEMORY -> RESOURCE_EXHAUSTED; INVALID_ARGUMENT/NULL_*/INVALID_SIZE/...
  // -> INVALID_ARGUMENT; UNSUPPORTED_* -> UNIMPLEMENTED; UNINITIALIZED/DEVICE_LOST ->
  // UNAVAILABLE; NOT_READY -> DEADLINE_EXCEEDED; anything else INTERNAL.
  static absl::Status ZeStatus(ze_result_t result, std::string_view what);
  // "ZE_RESULT_ERROR_X", or the number when it has no name here.
  static std::string ResultName(ze_result_t result);

  const std::vector<ZeDevice>& devices() const { return devices_; }
  // The device this process knows by `uuid` (16 raw bytes). FAILED_PRECONDITION "level_zero
  // device <uuid> is not visible in this process (ZE_AFFINITY_MASK=...)" when none;
  // UNAVAILABLE when the loader is.
  absl::StatusOr<const ZeDevice*> DeviceByUuid(std::string_view uuid) const;
  // The device of this process's ordinal. FAILED_PRECONDITION when there is none.
  absl::StatusOr<const ZeDevice*> DeviceByOrdinal(int32_t ordinal) const;

  // The fd inside a memory IPC handle (owned by the driver: dup it, never close it):
  // zeMemGetFileDescriptorFromIpcHandleExp where the loader has it, else the bytes where
  // Intel's driver lays it out (ze_handle.h's IpcFd). -1 when the driver will not say.
  int MemoryFdOf(ze_context_handle_t context, const ze_ipc_mem_handle_t& handle) const;
  // `handle` with `fd` (this process's) in place of the exporter's: the loader's
  // zeMemGetIpcHandleFromFileDescriptorExp where it has it, else SetIpcFd on the bytes.
  absl::StatusOr<ze_ipc_mem_handle_t> MemoryHandleWithFd(ze_context_handle_t context, ze_ipc_mem_handle_t handle,
                                                         int fd) const;

  // The required entry points, named as exported; null when unavailable.
#define TENSORD_ZE_LOADER_MEMBER(name) decltype(&::name) name = nullptr;
  TENSORD_ZE_LOADER_ENTRY_POINTS(TENSORD_ZE_LOADER_MEMBER)
#undef TENSORD_ZE_LOADER_MEMBER
  // Optional entry points (see above); null when the loader lacks them.
  ZeMemPutIpcHandleFn zeMemPutIpcHandle = nullptr;
  ZeMemGetFileDescriptorFromIpcHandleExpFn zeMemGetFileDescriptorFromIpcHandleExp = nullptr;
  ZeMemGetIpcHandleFromFileDescriptorExpFn zeMemGetIpcHandleFromFileDescriptorExp = nullptr;

 private:
  ZeLoader() = default;
  void Load();
  void Enumerate();

  std::string library_;
  std::string unavailable_reason_;
  void* dl_handle_ = nullptr;  // never dlclose'd: the table points into it
  std::vector<ZeDevice> devices_;
};

// A UUID as "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (device_names.h), for messages.
std::string FormatZeUuid(std::string_view uuid);
// "level_zero:N (uuid)".
std::string ZeDeviceName(const ZeDevice& device);

}  // namespace tensord::common
