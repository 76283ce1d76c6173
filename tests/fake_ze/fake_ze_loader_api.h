// The Level Zero API as the fake_ze tests reach it: Debian's real loader (libze_loader.so.1),
// dlopened as tensord's level_zero backend does and never linked, with its functions
// resolved by dlsym; the fake's test queries (tensord_fake_ze_*) on the library the loader
// loaded; and the small helpers that the tests and their helper processes
// (fake_ze_helper_process.h) share. It proves the plumbing, never the hardware.
#pragma once

#include <level_zero/ze_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace tensord::fake_ze_test {

inline constexpr uint64_t kWaitNs = 10'000'000'000ull;  // generous: CI machines are busy
// How long a stalled command must stay stalled to count as stalled.
inline constexpr auto kStallCheck = std::chrono::milliseconds(200);

// ---- The loader's API, resolved with dlsym ----------------------------------------------

// clang-format off
#define FAKE_ZE_LOADER_API(X)                                                               \
  X(zeInit) X(zeDriverGet) X(zeDriverGetApiVersion) X(zeDriverGetProperties)                \
  X(zeDriverGetIpcProperties) X(zeDriverGetExtensionProperties)                             \
  X(zeDriverGetExtensionFunctionAddress) X(zeDeviceGet) X(zeDeviceGetProperties)            \
  X(zeDeviceGetMemoryProperties) X(zeDeviceGetSubDevices)                                   \
  X(zeDeviceGetCommandQueueGroupProperties) X(zeContextCreate) X(zeContextDestroy)          \
  X(zeContextGetStatus) X(zeMemAllocDevice) X(zeMemAllocHost) X(zeMemFree)                  \
  X(zeMemGetAllocProperties) X(zeMemGetAddressRange) X(zeMemGetIpcHandle)                   \
  X(zeMemOpenIpcHandle) X(zeMemCloseIpcHandle) X(zeEventPoolCreate) X(zeEventPoolDestroy)   \
  X(zeEventPoolGetIpcHandle) X(zeEventPoolOpenIpcHandle) X(zeEventPoolCloseIpcHandle)       \
  X(zeEventCreate) X(zeEventDestroy) X(zeEventHostSignal) X(zeEventHostSynchronize)         \
  X(zeEventQueryStatus) X(zeEventHostReset) X(zeCommandListCreate)                          \
  X(zeCommandListCreateImmediate) X(zeCommandListClose) X(zeCommandListReset)               \
  X(zeCommandListDestroy) X(zeCommandListAppendMemoryCopy) X(zeCommandListAppendMemoryFill) \
  X(zeCommandListAppendBarrier) X(zeCommandListAppendSignalEvent)                           \
  X(zeCommandListAppendWaitOnEvents) X(zeCommandListAppendEventReset)                       \
  X(zeCommandQueueCreate) X(zeCommandQueueDestroy) X(zeCommandQueueExecuteCommandLists)     \
  X(zeCommandQueueSynchronize) X(zeModuleCreate)
// clang-format on

struct Ze {
#define FAKE_ZE_MEMBER(name) decltype(&::name) name = nullptr;
  FAKE_ZE_LOADER_API(FAKE_ZE_MEMBER)
#undef FAKE_ZE_MEMBER
};

// Once per process; nullptr if the loader or one of its functions is missing.
const Ze* LoadZe();

// ---- The fake's test queries, on the library the loader loaded --------------------------

// A symbol of the fake the loader loaded (ZE_ENABLE_ALT_DRIVERS), or nullptr.
void* FakeSymbol(const char* name);
// tensord_fake_ze_live_objects(kind): the fake's live objects of `kind` (-1 for a kind it
// does not know), or -2 when the query is missing.
int64_t Live(const char* kind);
// tensord_fake_ze_fail_next(api, result): the next call of `api` answers `result`; false
// when the query is missing.
bool FailNext(const char* api, ze_result_t result);

inline constexpr const char* kLiveKinds[] = {"allocation",   "host_allocation", "ipc_open",
                                             "event_pool",   "event_pool_open", "event",
                                             "command_list", "command_queue",   "context"};

// ---- Helpers both sides use -------------------------------------------------------------

using tensord::common::UniqueFd;

// "0x%08x": a result as the reports carry it.
std::string Str(ze_result_t result);
// Lower-case hex of `n` bytes.
std::string Hex(const uint8_t* bytes, size_t n);
// `n` bytes that depend on their index and `seed`.
std::vector<uint8_t> Pattern(size_t n, uint8_t seed);
// Little-endian integers in the IPC handles' bytes.
uint64_t LoadU64(const char* bytes);
void StoreU64(char* bytes, uint64_t value);
void StoreU32(char* bytes, uint32_t value);

// What an fd is: "/memfd:..." for the fake's memory.
std::string FdTarget(int fd);

// Receives one message and the fd it carries, if any; false after 30 s of silence.
bool RecvMsg(int sock, std::string* payload, UniqueFd* fd = nullptr);

// "key=value" lines, the helpers' reports.
class Report {
 public:
  void Add(const std::string& key, const std::string& value) { text_ += key + "=" + value + "\n"; }
  void Add(const std::string& key, ze_result_t value) { Add(key, Str(value)); }
  void Add(const std::string& key, int64_t value) { Add(key, std::to_string(value)); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// The fields of a Report's text.
std::map<std::string, std::string> ParseReport(const std::string& text);

// A zeroed Level Zero structure that says what it is (a partial brace initialiser warns).
template <class T>
T Zeroed(ze_structure_type_t stype) {
  T value{};
  value.stype = stype;
  return value;
}

inline ze_command_queue_desc_t QueueDesc(
    ze_command_queue_mode_t mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS) {
  auto desc = Zeroed<ze_command_queue_desc_t>(ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC);
  desc.mode = mode;
  return desc;
}

}  // namespace tensord::fake_ze_test
