#include "common/memory/level_zero/ze_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/memory/driver_library.h"
#include "common/memory/level_zero/ze_handle.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace tensord::common {
namespace {

constexpr const char kDefaultLibrary[] = "libze_loader.so.1";

std::string AffinityText() {
  const char* mask = std::getenv("ZE_AFFINITY_MASK");
  return mask == nullptr ? "ZE_AFFINITY_MASK unset" : absl::StrCat("ZE_AFFINITY_MASK=", mask);
}

absl::StatusCode CodeFor(ze_result_t result) {
  switch (result) {
    case ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY:
    case ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case ZE_RESULT_ERROR_INVALID_ARGUMENT:
    case ZE_RESULT_ERROR_INVALID_NULL_HANDLE:
    case ZE_RESULT_ERROR_INVALID_NULL_POINTER:
    case ZE_RESULT_ERROR_INVALID_SIZE:
    case ZE_RESULT_ERROR_UNSUPPORTED_SIZE:
    case ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT:
    case ZE_RESULT_ERROR_INVALID_ENUMERATION:
    case ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE:
      return absl::StatusCode::kInvalidArgument;
    case ZE_RESULT_ERROR_UNSUPPORTED_VERSION:
    case ZE_RESULT_ERROR_UNSUPPORTED_FEATURE:
    case ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION:
      return absl::StatusCode::kUnimplemented;
    case ZE_RESULT_ERROR_UNINITIALIZED:
    case ZE_RESULT_ERROR_DEVICE_LOST:
      return absl::StatusCode::kUnavailable;
    case ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS:
      return absl::StatusCode::kPermissionDenied;
    case ZE_RESULT_NOT_READY:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

std::string ZeLoader::ResultName(ze_result_t result) {
  switch (result) {
#define TENSORD_ZE_RESULT_NAME(r) \
  case r:                         \
    return #r;
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_SUCCESS)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_NOT_READY)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_DEVICE_LOST)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_MODULE_BUILD_FAILURE)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_MODULE_LINK_FAILURE)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_NOT_AVAILABLE)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_UNINITIALIZED)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_UNSUPPORTED_VERSION)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_INVALID_ARGUMENT)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_INVALID_NULL_HANDLE)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_INVALID_NULL_POINTER)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_INVALID_SIZE)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_UNSUPPORTED_SIZE)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_INVALID_ENUMERATION)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION)
    TENSORD_ZE_RESULT_NAME(ZE_RESULT_ERROR_UNKNOWN)
#undef TENSORD_ZE_RESULT_NAME
    default:
      return absl::StrCat("ze_result_t 0x", absl::Hex(static_cast<uint32_t>(result)));
  }
}

absl::Status ZeLoader::ZeStatus(ze_result_t result, std::string_view what) {
  if (result == ZE_RESULT_SUCCESS) return absl::OkStatus();
  return absl::Status(CodeFor(result), absl::StrCat(std::string(what), ": ", ResultName(result)));
}

const ZeLoader& ZeLoader::Get() {
  // Leaked on purpose: regions may be closed from static destructors and DLPack deleters
  // that run during exit, after a function-local static would be gone.
  static const ZeLoader* const loader = [] {
    auto* l = new ZeLoader();
    l->Load();
    if (l->available()) l->Enumerate();
    if (!l->available()) spdlog::info("level_zero: unavailable: {}", l->unavailable_reason());
    return l;
  }();
  return *loader;
}

void ZeLoader::Load() {
  library_ = DriverLibraryPath("TENSORD_LIBZE_LOADER", kDefaultLibrary);
  dl_handle_ = OpenDriverLibrary(library_, "no Level Zero loader on this machine (Debian: libze1)", &unavailable_reason_);
  if (dl_handle_ == nullptr) return;
  // Resolve everything before calling anything, so a partial table is never used.
  bool complete = true;
#define TENSORD_ZE_LOADER_RESOLVE(name)                                                                        \
  if (complete) {                                                                                              \
    void* symbol = DriverSymbol(dl_handle_, library_, #name, "not a Level Zero loader of API 1.4 or later", \
                                &unavailable_reason_);                                                         \
    complete = symbol != nullptr;                                                                              \
    if (complete) name = reinterpret_cast<decltype(name)>(symbol);                                             \
  }
  TENSORD_ZE_LOADER_ENTRY_POINTS(TENSORD_ZE_LOADER_RESOLVE)
#undef TENSORD_ZE_LOADER_RESOLVE
  if (complete) {
    zeMemPutIpcHandle = reinterpret_cast<ZeMemPutIpcHandleFn>(::dlsym(dl_handle_, "zeMemPutIpcHandle"));
    zeMemGetFileDescriptorFromIpcHandleExp = reinterpret_cast<ZeMemGetFileDescriptorFromIpcHandleExpFn>(
        ::dlsym(dl_handle_, "zeMemGetFileDescriptorFromIpcHandleExp"));
    zeMemGetIpcHandleFromFileDescriptorExp = reinterpret_cast<ZeMemGetIpcHandleFromFileDescriptorExpFn>(
        ::dlsym(dl_handle_, "zeMemGetIpcHandleFromFileDescriptorExp"));
    if (ze_result_t r = zeInit(ZE_INIT_FLAG_GPU_ONLY); r != ZE_RESULT_SUCCESS) {
      // The loader answers UNINITIALIZED when it found no driver that initialises.
      unavailable_reason_ = absl::StrCat("no Level Zero GPU driver: zeInit: ", ResultName(r),
                                         " (no Level Zero GPU driver is installed, or none found a device)");
      complete = false;
    }
  }
  if (!complete) {
    // Unavailable means every entry point is null: no caller can reach a half-loaded table.
#define TENSORD_ZE_LOADER_CLEAR(name) name = nullptr;
    TENSORD_ZE_LOADER_ENTRY_POINTS(TENSORD_ZE_LOADER_CLEAR)
#undef TENSORD_ZE_LOADER_CLEAR
    zeMemPutIpcHandle = nullptr;
    zeMemGetFileDescriptorFromIpcHandleExp = nullptr;
    zeMemGetIpcHandleFromFileDescriptorExp = nullptr;
  }
}

void ZeLoader::Enumerate() {
  uint32_t driver_count = 0;
  if (ze_result_t r = zeDriverGet(&driver_count, nullptr); r != ZE_RESULT_SUCCESS) {
    unavailable_reason_ = absl::StrCat("zeDriverGet: ", ResultName(r));
    return;
  }
  std::vector<ze_driver_handle_t> drivers(driver_count);
  if (driver_count > 0) {
    if (ze_result_t r = zeDriverGet(&driver_count, drivers.data()); r != ZE_RESULT_SUCCESS) {
      unavailable_reason_ = absl::StrCat("zeDriverGet: ", ResultName(r));
      return;
    }
    drivers.resize(driver_count);
  }
  std::vector<std::string> skipped;
  for (ze_driver_handle_t driver : drivers) {
    // IPC is the whole point: a driver that cannot share memory and event pools is no use.
    ze_driver_ipc_properties_t ipc{};
    ipc.stype = ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES;
    if (ze_result_t r = zeDriverGetIpcProperties(driver, &ipc); r != ZE_RESULT_SUCCESS) {
      skipped.push_back(absl::StrCat("a driver: zeDriverGetIpcProperties: ", ResultName(r)));
      continue;
    }
    if ((ipc.flags & ZE_IPC_PROPERTY_FLAG_MEMORY) == 0 || (ipc.flags & ZE_IPC_PROPERTY_FLAG_EVENT_POOL) == 0) {
      skipped.push_back("a driver without IPC of memory and event pools");
      continue;
    }
    uint32_t count = 0;
    if (ze_result_t r = zeDeviceGet(driver, &count, nullptr); r != ZE_RESULT_SUCCESS) {
      skipped.push_back(absl::StrCat("a driver: zeDeviceGet: ", ResultName(r)));
      continue;
    }
    std::vector<ze_device_handle_t> handles(count);
    if (count > 0 && zeDeviceGet(driver, &count, handles.data()) != ZE_RESULT_SUCCESS) continue;
    handles.resize(count);
    for (ze_device_handle_t handle : handles) {
      const auto ordinal = static_cast<int32_t>(devices_.size());
      if (ordinal >= kMaxZeDevices) {
        skipped.push_back(absl::StrCat("devices past the first ", kMaxZeDevices));
        break;
      }
      ze_device_properties_t props{};
      props.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
      if (ze_result_t r = zeDeviceGetProperties(handle, &props); r != ZE_RESULT_SUCCESS) {
        skipped.push_back(absl::StrCat("level_zero:", ordinal, ": zeDeviceGetProperties: ", ResultName(r)));
        continue;
      }
      ZeDevice d;
      d.ordinal = ordinal;
      d.driver = driver;
      d.device = handle;
      d.uuid.assign(reinterpret_cast<const char*>(props.uuid.id), ZE_MAX_DEVICE_UUID_SIZE);
      d.name.assign(props.name, ::strnlen(props.name, sizeof(props.name)));
      uint32_t memories = 0;
      if (zeDeviceGetMemoryProperties(handle, &memories, nullptr) == ZE_RESULT_SUCCESS && memories > 0) {
        std::vector<ze_device_memory_properties_t> mem(memories);
        for (auto& m : mem) m.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES;
        if (zeDeviceGetMemoryProperties(handle, &memories, mem.data()) == ZE_RESULT_SUCCESS) {
          for (uint32_t i = 0; i < memories && i < mem.size(); ++i) d.total_bytes += mem[i].totalSize;
        }
      }
      devices_.push_back(std::move(d));
    }
  }
  for (const std::string& why : skipped) spdlog::warn("level_zero: left out: {}", why);
  if (devices_.empty()) {
    unavailable_reason_ = absl::StrCat("no Level Zero device (", skipped.empty() ? "the drivers report none" : skipped.front(),
                                       "; ", AffinityText(), ")");
  }
}

absl::StatusOr<const ZeDevice*> ZeLoader::DeviceByUuid(std::string_view uuid) const {
  if (!available()) return absl::UnavailableError(absl::StrCat("level_zero: ", unavailable_reason_));
  for (const ZeDevice& d : devices_) {
    if (d.uuid == uuid) return &d;
  }
  return absl::FailedPreconditionError(absl::StrCat("level_zero device ", FormatZeUuid(uuid),
                                                    " is not visible in this process (", AffinityText(), ")"));
}

absl::StatusOr<const ZeDevice*> ZeLoader::DeviceByOrdinal(int32_t ordinal) const {
  if (!available()) return absl::UnavailableError(absl::StrCat("level_zero: ", unavailable_reason_));
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= devices_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("level_zero device ", ordinal, " does not exist here (",
                                                      devices_.size(), " visible; ", AffinityText(), ")"));
  }
  return &devices_[static_cast<size_t>(ordinal)];
}

std::string FormatZeUuid(std::string_view uuid) {
  // As device_names.h spells it (that library links this one, so the format is repeated).
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (uuid.size() == 16 && (i == 4 || i == 6 || i == 8 || i == 10)) out.push_back('-');
    const auto byte = static_cast<uint8_t>(uuid[i]);
    out.push_back(kHex[byte >> 4]);
    out.push_back(kHex[byte & 0xf]);
  }
  return out;
}

std::string ZeDeviceName(const ZeDevice& device) {
  return absl::StrCat("level_zero:", device.ordinal, " (", FormatZeUuid(device.uuid), ")");
}

}  // namespace tensord::common

namespace tensord::common {
namespace {

std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> BytesOf(const ze_ipc_mem_handle_t& handle) {
  std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> bytes{};
  std::memcpy(bytes.data(), handle.data, bytes.size());
  return bytes;
}

}  // namespace

int ZeLoader::MemoryFdOf(ze_context_handle_t context, const ze_ipc_mem_handle_t& handle) const {
  if (zeMemGetFileDescriptorFromIpcHandleExp != nullptr) {
    uint64_t fd = 0;
    if (zeMemGetFileDescriptorFromIpcHandleExp(context, handle, &fd) == ZE_RESULT_SUCCESS) {
      return static_cast<int>(fd);
    }
    return -1;
  }
  return IpcFd(BytesOf(handle));
}

absl::StatusOr<ze_ipc_mem_handle_t> ZeLoader::MemoryHandleWithFd(ze_context_handle_t context,
                                                                 ze_ipc_mem_handle_t handle, int fd) const {
  if (zeMemGetIpcHandleFromFileDescriptorExp != nullptr) {
    ze_ipc_mem_handle_t out{};
    TENSORD_RETURN_IF_ERROR(ZeStatus(
        zeMemGetIpcHandleFromFileDescriptorExp(context, static_cast<uint64_t>(fd), &out),
        "zeMemGetIpcHandleFromFileDescriptorExp"));
    return out;
  }
  std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> bytes = BytesOf(handle);
  SetIpcFd(bytes, fd);
  std::memcpy(handle.data, bytes.data(), bytes.size());
  return handle;
}

}  // namespace tensord::common
