// libtensord_fake_ze.so: a SOFTWARE Level Zero driver, for tests only, loaded by the real
// loader (libze_loader.so.1) through ZE_ENABLE_ALT_DRIVERS. It proves tensord's plumbing
// (the loader's DDI tables, handle encoding, fd passing, UUID -> device mapping, context
// rules, event ordering, cleanup) on machines without an Intel GPU. It proves nothing about
// the hardware or Intel's driver: "device memory" is host memory in memfds and "device
// work" runs on host threads. See README.md beside it.
//
// This file: zeInit, the driver, devices and contexts, the test queries, and the global,
// driver, device and context DDI tables. Memory is in fake_ze_memory.cc, events in
// fake_ze_events.cc, command lists and queues in fake_ze_commands.cc, the tables the fake
// leaves empty in fake_ze_empty_tables.cc.
//
// Environment:
//   TENSORD_FAKE_ZE_DEVICES=N          devices (default 1, at most 64; 0: zeInit succeeds,
//                                      zeDeviceGet finds none); read at the first
//                                      successful zeInit
//   TENSORD_FAKE_ZE_DEVICE_MEMORY=B    each device's memory in bytes (default 1 GiB); same
//   TENSORD_FAKE_ZE_FAIL_INIT=1        zeInit answers ZE_RESULT_ERROR_UNINITIALIZED (read at
//                                      every call)
// A malformed value makes zeInit answer ZE_RESULT_ERROR_UNINITIALIZED too.
#include <level_zero/ze_ddi.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tests/fake_ze/fake_ze.h"

namespace fake_ze {
namespace {

constexpr uint32_t kMaxDevices = 64;
constexpr uint64_t kDefaultDeviceMemory = 1ull << 30;
// Not a PCI vendor: 0x7e57 ("test"), so nothing mistakes the fake for an Intel device.
constexpr uint32_t kVendorId = 0x7e57;
constexpr uint32_t kDeviceId = 0x0001;

// Reads a non-negative integer variable; false (with a message) if it is set but not one
// or above `max`.
bool ReadEnv(const char* name, uint64_t fallback, uint64_t max, uint64_t* out) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    *out = fallback;
    return true;
  }
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-' || value > max) {
    std::fprintf(stderr, "libtensord_fake_ze: %s=%s is not an integer in [0, %" PRIu64 "]\n", name,
                 text, max);
    return false;
  }
  *out = value;
  return true;
}

ze_device_uuid_t DeviceUuid(uint32_t index) {
  // "zefake-tensord" then the index, big-endian: the same in every process.
  static constexpr char kPrefix[] = "zefake-tensord";
  static_assert(sizeof(kPrefix) - 1 == ZE_MAX_DEVICE_UUID_SIZE - 2);
  ze_device_uuid_t uuid{};
  std::memcpy(uuid.id, kPrefix, sizeof(kPrefix) - 1);
  uuid.id[14] = static_cast<uint8_t>(index >> 8);
  uuid.id[15] = static_cast<uint8_t>(index);
  return uuid;
}

}  // namespace

State& State::Get() {
  static State* const state = new State;  // leaked on purpose: see the declaration
  return *state;
}

bool State::LiveDevice(ze_device_handle_t device) const {
  for (const auto& d : devices) {
    if (d.get() == device) return true;
  }
  return false;
}

std::shared_ptr<Region> State::Find(const void* ptr) const {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  auto it = regions.upper_bound(addr);
  if (it == regions.begin()) return nullptr;
  --it;
  const Region& region = *it->second;
  if (addr - it->first >= region.size) return nullptr;
  return it->second;
}

ze_result_t Enter(State& state, const char* api) {
  if (!state.initialized) return ZE_RESULT_ERROR_UNINITIALIZED;
  auto it = state.fail_next.find(api);
  if (it == state.fail_next.end()) return ZE_RESULT_SUCCESS;
  const ze_result_t injected = it->second;
  state.fail_next.erase(it);
  return injected;
}

// ---- Global -----------------------------------------------------------------------------

ze_result_t ZE_APICALL zeInit(ze_init_flags_t flags) {
  State& state = State::Get();
  std::lock_guard<std::mutex> lock(state.mu);
  if (auto it = state.fail_next.find(__func__); it != state.fail_next.end()) {
    const ze_result_t injected = it->second;
    state.fail_next.erase(it);
    return injected;
  }
  if (flags > (ZE_INIT_FLAG_GPU_ONLY | ZE_INIT_FLAG_VPU_ONLY)) {
    return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  }
  if (const char* fail = std::getenv("TENSORD_FAKE_ZE_FAIL_INIT");
      fail != nullptr && std::strcmp(fail, "1") == 0) {
    return ZE_RESULT_ERROR_UNINITIALIZED;
  }
  // A GPU driver has nothing to offer a caller that asked for VPUs only.
  if (flags != 0 && (flags & ZE_INIT_FLAG_GPU_ONLY) == 0) return ZE_RESULT_ERROR_UNINITIALIZED;
  if (state.initialized) return ZE_RESULT_SUCCESS;

  uint64_t count = 0;
  uint64_t memory = 0;
  if (!ReadEnv("TENSORD_FAKE_ZE_DEVICES", 1, kMaxDevices, &count) ||
      !ReadEnv("TENSORD_FAKE_ZE_DEVICE_MEMORY", kDefaultDeviceMemory, UINT64_MAX >> 1, &memory)) {
    return ZE_RESULT_ERROR_UNINITIALIZED;
  }
  if (memory == 0) {
    std::fprintf(stderr,
                 "libtensord_fake_ze: TENSORD_FAKE_ZE_DEVICE_MEMORY=0: a device needs memory\n");
    return ZE_RESULT_ERROR_UNINITIALIZED;
  }
  for (uint32_t i = 0; i < count; ++i) {
    auto device = std::make_unique<_ze_device_handle_t>();
    device->index = i;
    device->total_memory = memory;
    state.devices.push_back(std::move(device));
  }
  state.initialized = true;
  return ZE_RESULT_SUCCESS;
}

// ---- Driver -----------------------------------------------------------------------------

ze_result_t ZE_APICALL zeDriverGet(uint32_t* pCount, ze_driver_handle_t* phDrivers) {
  FAKE_ZE_ENTER();
  if (pCount == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (*pCount != 0 && phDrivers != nullptr) phDrivers[0] = &state.driver;
  *pCount = 1;
  return ZE_RESULT_SUCCESS;
}

// Every driver call checks its handle the same way.
#define FAKE_ZE_CHECK_DRIVER(h)                                   \
  if ((h) == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE; \
  if ((h) != &state.driver) return ZE_RESULT_ERROR_INVALID_ARGUMENT

ze_result_t ZE_APICALL zeDriverGetApiVersion(ze_driver_handle_t hDriver,
                                             ze_api_version_t* version) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DRIVER(hDriver);
  if (version == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *version = ZE_API_VERSION_1_4;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeDriverGetProperties(ze_driver_handle_t hDriver,
                                             ze_driver_properties_t* pDriverProperties) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DRIVER(hDriver);
  if (pDriverProperties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  ClearOutput(pDriverProperties);
  static constexpr char kUuid[ZE_MAX_DRIVER_UUID_SIZE] = {'t', 'e', 'n', 's', 'o', 'r', 'd', '-',
                                                          'f', 'a', 'k', 'e', '-', 'z', 'e', 0};
  std::memcpy(pDriverProperties->uuid.id, kUuid, sizeof(kUuid));
  pDriverProperties->driverVersion = 1;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeDriverGetIpcProperties(ze_driver_handle_t hDriver,
                                                ze_driver_ipc_properties_t* pIpcProperties) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DRIVER(hDriver);
  if (pIpcProperties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  ClearOutput(pIpcProperties);
  pIpcProperties->flags = ZE_IPC_PROPERTY_FLAG_MEMORY | ZE_IPC_PROPERTY_FLAG_EVENT_POOL;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL
zeDriverGetExtensionProperties(ze_driver_handle_t hDriver, uint32_t* pCount,
                               ze_driver_extension_properties_t* pExtensionProperties) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DRIVER(hDriver);
  if (pCount == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *pCount = 0;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeDriverGetExtensionFunctionAddress(ze_driver_handle_t hDriver,
                                                           const char* name,
                                                           void** ppFunctionAddress) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DRIVER(hDriver);
  if (name == nullptr || ppFunctionAddress == nullptr) {
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  }
  *ppFunctionAddress = nullptr;  // no extensions, as Intel's driver answers unknown names
  return ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

// ---- Device -----------------------------------------------------------------------------

ze_result_t ZE_APICALL zeDeviceGet(ze_driver_handle_t hDriver, uint32_t* pCount,
                                   ze_device_handle_t* phDevices) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DRIVER(hDriver);
  if (pCount == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  const auto total = static_cast<uint32_t>(state.devices.size());
  if (*pCount == 0 || phDevices == nullptr) {
    *pCount = total;
    return ZE_RESULT_SUCCESS;
  }
  const uint32_t n = std::min(*pCount, total);
  for (uint32_t i = 0; i < n; ++i) phDevices[i] = state.devices[i].get();
  *pCount = n;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeDeviceGetSubDevices(ze_device_handle_t hDevice, uint32_t* pCount,
                                             ze_device_handle_t* phSubdevices) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DEVICE(hDevice);
  if (pCount == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *pCount = 0;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeDeviceGetProperties(ze_device_handle_t hDevice,
                                             ze_device_properties_t* pDeviceProperties) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DEVICE(hDevice);
  if (pDeviceProperties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  ze_device_properties_t& p = *pDeviceProperties;
  ClearOutput(&p);
  p.type = ZE_DEVICE_TYPE_GPU;
  p.vendorId = kVendorId;
  p.deviceId = kDeviceId;
  p.flags = 0;  // not integrated, not a sub-device, no ECC, no on-demand paging
  p.coreClockRate = 1000;
  p.maxMemAllocSize = hDevice->total_memory;
  p.maxHardwareContexts = 1;
  p.numThreadsPerEU = 1;
  p.physicalEUSimdWidth = 8;
  p.numEUsPerSubslice = 1;
  p.numSubslicesPerSlice = 1;
  p.numSlices = 1;
  p.timerResolution = 1;
  p.timestampValidBits = 64;
  p.kernelTimestampValidBits = 64;
  p.uuid = DeviceUuid(hDevice->index);
  std::snprintf(p.name, sizeof(p.name), "tensord fake Level Zero device %" PRIu32, hDevice->index);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeDeviceGetMemoryProperties(ze_device_handle_t hDevice, uint32_t* pCount,
                                                   ze_device_memory_properties_t* pMemProperties) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DEVICE(hDevice);
  if (pCount == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (*pCount != 0 && pMemProperties != nullptr) {
    ClearOutput(pMemProperties);
    pMemProperties->totalSize = hDevice->total_memory;
    std::snprintf(pMemProperties->name, sizeof(pMemProperties->name), "fake (host memfd)");
  }
  *pCount = 1;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeDeviceGetCommandQueueGroupProperties(
    ze_device_handle_t hDevice, uint32_t* pCount,
    ze_command_queue_group_properties_t* pCommandQueueGroupProperties) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DEVICE(hDevice);
  if (pCount == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (*pCount != 0 && pCommandQueueGroupProperties != nullptr) {
    ClearOutput(pCommandQueueGroupProperties);
    pCommandQueueGroupProperties->flags =
        ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE | ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
    pCommandQueueGroupProperties->maxMemoryFillPatternSize = kMaxFillPatternSize;
    pCommandQueueGroupProperties->numQueues = 1;
  }
  *pCount = 1;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeDeviceGetStatus(ze_device_handle_t hDevice) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DEVICE(hDevice);
  return ZE_RESULT_SUCCESS;
}

// ---- Context ----------------------------------------------------------------------------

ze_result_t ZE_APICALL zeContextCreate(ze_driver_handle_t hDriver, const ze_context_desc_t* desc,
                                       ze_context_handle_t* phContext) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_DRIVER(hDriver);
  if (desc == nullptr || phContext == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->flags > ZE_CONTEXT_FLAG_TBD) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  *phContext = state.contexts.Add(std::make_unique<_ze_context_handle_t>());
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeContextDestroy(ze_context_handle_t hContext) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  // Strict on purpose: what the context still holds is a leak in the caller.
  bool in_use = state.pools.CountIf([&](const auto& p) { return p.context == hContext; }) != 0 ||
                state.lists.CountIf([&](const auto& l) { return l.context == hContext; }) != 0 ||
                state.queues.CountIf([&](const auto& q) { return q.context == hContext; }) != 0;
  for (const auto& entry : state.regions) in_use = in_use || entry.second->context == hContext;
  if (in_use) return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
  state.contexts.Take(hContext);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeContextGetStatus(ze_context_handle_t hContext) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  return ZE_RESULT_SUCCESS;
}

}  // namespace fake_ze

// ---- What the loader and the tests look up ----------------------------------------------

extern "C" {

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetGlobalProcAddrTable(ze_api_version_t version,
                                                             ze_global_dditable_t* pDdiTable) {
  if (ze_result_t r = fake_ze::StartTable(version, pDdiTable); r != ZE_RESULT_SUCCESS) return r;
  pDdiTable->pfnInit = fake_ze::zeInit;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDriverProcAddrTable(ze_api_version_t version,
                                                             ze_driver_dditable_t* pDdiTable) {
  if (ze_result_t r = fake_ze::StartTable(version, pDdiTable); r != ZE_RESULT_SUCCESS) return r;
  pDdiTable->pfnGet = fake_ze::zeDriverGet;
  pDdiTable->pfnGetApiVersion = fake_ze::zeDriverGetApiVersion;
  pDdiTable->pfnGetProperties = fake_ze::zeDriverGetProperties;
  pDdiTable->pfnGetIpcProperties = fake_ze::zeDriverGetIpcProperties;
  pDdiTable->pfnGetExtensionProperties = fake_ze::zeDriverGetExtensionProperties;
  pDdiTable->pfnGetExtensionFunctionAddress = fake_ze::zeDriverGetExtensionFunctionAddress;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDeviceProcAddrTable(ze_api_version_t version,
                                                             ze_device_dditable_t* pDdiTable) {
  if (ze_result_t r = fake_ze::StartTable(version, pDdiTable); r != ZE_RESULT_SUCCESS) return r;
  pDdiTable->pfnGet = fake_ze::zeDeviceGet;
  pDdiTable->pfnGetSubDevices = fake_ze::zeDeviceGetSubDevices;
  pDdiTable->pfnGetProperties = fake_ze::zeDeviceGetProperties;
  pDdiTable->pfnGetCommandQueueGroupProperties = fake_ze::zeDeviceGetCommandQueueGroupProperties;
  pDdiTable->pfnGetMemoryProperties = fake_ze::zeDeviceGetMemoryProperties;
  pDdiTable->pfnGetStatus = fake_ze::zeDeviceGetStatus;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetContextProcAddrTable(ze_api_version_t version,
                                                              ze_context_dditable_t* pDdiTable) {
  if (ze_result_t r = fake_ze::StartTable(version, pDdiTable); r != ZE_RESULT_SUCCESS) return r;
  pDdiTable->pfnCreate = fake_ze::zeContextCreate;
  pDdiTable->pfnDestroy = fake_ze::zeContextDestroy;
  pDdiTable->pfnGetStatus = fake_ze::zeContextGetStatus;
  return ZE_RESULT_SUCCESS;
}

// How many objects of `kind` this process holds: "allocation" (zeMemAllocDevice),
// "host_allocation", "ipc_open" (open IPC memory mappings), "ipc_opens_total" (ever),
// "event_pool", "event_pool_open" (opened from IPC handles), "event", "command_list",
// "command_queue", "context". -1 for an unknown kind.
ZE_DLLEXPORT int64_t tensord_fake_ze_live_objects(const char* kind) {
  using fake_ze::RegionKind;
  fake_ze::State& state = fake_ze::State::Get();
  std::lock_guard<std::mutex> lock(state.mu);
  const std::string k = kind != nullptr ? kind : "";
  auto regions_of = [&](RegionKind want) {
    int64_t n = 0;
    for (const auto& entry : state.regions) n += entry.second->kind == want ? 1 : 0;
    return n;
  };
  if (k == "allocation") return regions_of(RegionKind::kDevice);
  if (k == "host_allocation") return regions_of(RegionKind::kHost);
  if (k == "ipc_open") return regions_of(RegionKind::kIpcOpen);
  if (k == "ipc_opens_total") return state.ipc_opens_total;
  if (k == "event_pool") return state.pools.CountIf([](const auto& p) { return !p.imported; });
  if (k == "event_pool_open") return state.pools.CountIf([](const auto& p) { return p.imported; });
  if (k == "event") return static_cast<int64_t>(state.events.size());
  if (k == "command_list") return static_cast<int64_t>(state.lists.size());
  if (k == "command_queue") return static_cast<int64_t>(state.queues.size());
  if (k == "context") return static_cast<int64_t>(state.contexts.size());
  return -1;
}

// The next call of `api` (its name, e.g. "zeMemAllocDevice") answers `result` and does
// nothing else; ZE_RESULT_SUCCESS cancels a pending injection.
ZE_DLLEXPORT void tensord_fake_ze_fail_next(const char* api, int32_t result) {
  if (api == nullptr) return;
  fake_ze::State& state = fake_ze::State::Get();
  std::lock_guard<std::mutex> lock(state.mu);
  if (result == ZE_RESULT_SUCCESS) {
    state.fail_next.erase(api);
  } else {
    state.fail_next[api] = static_cast<ze_result_t>(result);
  }
}

}  // extern "C"
