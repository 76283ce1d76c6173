// libtensord_fake_ze.so driven through Debian's real Level Zero loader (libze_loader.so.1,
// dlopened as tensord's level_zero backend does, never linked) and across real processes:
// zeInit and enumeration, memory and its IPC handles (the fd passed over a socketpair with
// SCM_RIGHTS), IPC event pools, command-list ordering, the context rules, fault injection
// and the "no usable driver" paths. It proves the plumbing, never the hardware.
//
// The loader initialises once per process, so whatever needs another environment, or
// another process, runs in a helper: this binary again (fork + exec), told its role by
// TENSORD_FAKE_ZE_TEST_ROLE; it runs before main() and reports back over the socketpair.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <level_zero/ze_api.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/unique_fd.h"
#include "tests/fd_passing.h"

extern char** environ;

namespace {

constexpr char kRoleEnv[] = "TENSORD_FAKE_ZE_TEST_ROLE";
constexpr char kSockEnv[] = "TENSORD_FAKE_ZE_TEST_SOCK";
constexpr uint64_t kWaitNs = 10'000'000'000ull;  // generous: CI machines are busy
// How long a stalled command must stay stalled to count as stalled.
constexpr auto kStallCheck = std::chrono::milliseconds(200);

// Before main(), in the test and in every helper it spawns: the fake is the only driver,
// and with no loader intercept the loader hands out the driver's own handles.
[[maybe_unused]] const bool kEnvironmentSet = [] {
  ::setenv("ZE_ENABLE_ALT_DRIVERS", TENSORD_FAKE_ZE_PATH, /*overwrite=*/0);
  for (const char* name : {"ZE_ENABLE_LOADER_INTERCEPT", "ZE_ENABLE_VALIDATION_LAYER",
                           "ZE_ENABLE_TRACING_LAYER", "ZE_ENABLE_NULL_DRIVER"}) {
    ::unsetenv(name);
  }
  if (std::getenv(kRoleEnv) == nullptr) {
    // The test itself runs with the fake's defaults; helpers get their knobs explicitly.
    for (const char* name : {"TENSORD_FAKE_ZE_DEVICES", "TENSORD_FAKE_ZE_DEVICE_MEMORY",
                             "TENSORD_FAKE_ZE_FAIL_INIT"}) {
      ::unsetenv(name);
    }
  }
  return true;
}();

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
const Ze* LoadZe() {
  static const Ze* const ze = []() -> const Ze* {
    void* loader = ::dlopen("libze_loader.so.1", RTLD_NOW | RTLD_LOCAL);
    if (loader == nullptr) {
      std::fprintf(stderr, "dlopen(libze_loader.so.1): %s\n", ::dlerror());
      return nullptr;
    }
    auto table = std::make_unique<Ze>();
#define FAKE_ZE_RESOLVE(name)                                                \
  table->name = reinterpret_cast<decltype(&::name)>(::dlsym(loader, #name)); \
  if (table->name == nullptr) {                                              \
    std::fprintf(stderr, "libze_loader.so.1 lacks %s\n", #name);             \
    return nullptr;                                                          \
  }
    FAKE_ZE_LOADER_API(FAKE_ZE_RESOLVE)
#undef FAKE_ZE_RESOLVE
    return table.release();  // for the life of the process, as the loader
  }();
  return ze;
}

// ---- The fake's test queries, on the library the loader loaded --------------------------

void* FakeSymbol(const char* name) {
  void* lib = ::dlopen(std::getenv("ZE_ENABLE_ALT_DRIVERS"), RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  void* symbol = ::dlsym(lib, name);
  ::dlclose(lib);  // the loader keeps it loaded
  return symbol;
}

int64_t Live(const char* kind) {
  auto fn = reinterpret_cast<int64_t (*)(const char*)>(FakeSymbol("tensord_fake_ze_live_objects"));
  return fn != nullptr ? fn(kind) : -2;
}

bool FailNext(const char* api, ze_result_t result) {
  auto fn =
      reinterpret_cast<void (*)(const char*, int32_t)>(FakeSymbol("tensord_fake_ze_fail_next"));
  if (fn == nullptr) return false;
  fn(api, static_cast<int32_t>(result));
  return true;
}

constexpr const char* kLiveKinds[] = {"allocation",   "host_allocation", "ipc_open",
                                      "event_pool",   "event_pool_open", "event",
                                      "command_list", "command_queue",   "context"};

// ---- Helpers both sides use -------------------------------------------------------------

using tensord::common::UniqueFd;

std::string Str(ze_result_t result) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", static_cast<unsigned>(result));
  return text;
}

std::string Hex(const uint8_t* bytes, size_t n) {
  std::string out;
  char two[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(two, sizeof(two), "%02x", bytes[i]);
    out += two;
  }
  return out;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + seed);
  return bytes;
}

uint64_t LoadU64(const char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

void StoreU64(char* bytes, uint64_t value) {
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
}

void StoreU32(char* bytes, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
}

// What an fd is: "/memfd:..." for the fake's memory.
std::string FdTarget(int fd) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  char target[256];
  const ssize_t n = ::readlink(path, target, sizeof(target) - 1);
  return n < 0 ? std::string() : std::string(target, static_cast<size_t>(n));
}


// Receives one message and the fd it carries, if any; false after 30 s of silence.
bool RecvMsg(int sock, std::string* payload, UniqueFd* fd = nullptr) {
  pollfd ready{sock, POLLIN, 0};
  if (::poll(&ready, 1, 30'000) != 1) return false;
  std::string buffer(256 << 10, '\0');
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) return false;
  buffer.resize(static_cast<size_t>(n));
  *payload = std::move(buffer);
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(cmsg), sizeof(int));
      UniqueFd owned(received);
      if (fd != nullptr) *fd = std::move(owned);
    }
  }
  return true;
}

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

std::map<std::string, std::string> ParseReport(const std::string& text) {
  std::map<std::string, std::string> fields;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return fields;
}

// A zeroed Level Zero structure that says what it is (a partial brace initialiser warns).
template <class T>
T Zeroed(ze_structure_type_t stype) {
  T value{};
  value.stype = stype;
  return value;
}

ze_command_queue_desc_t QueueDesc(
    ze_command_queue_mode_t mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS) {
  auto desc = Zeroed<ze_command_queue_desc_t>(ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC);
  desc.mode = mode;
  return desc;
}

// ---- The helper processes (before main, in a fresh exec of this binary) ----------------

// Gives up on a helper: tells the parent what failed, exits 2.
#define CHILD_REQUIRE(cond)                                                                        \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      tensord::common::testing::SendWithFd(sock, std::string("fatal=") + #cond + " (line " + std::to_string(__LINE__) + ")\n"); \
      return 2;                                                                                    \
    }                                                                                              \
  } while (0)

struct ChildSession {
  const Ze* ze = nullptr;
  ze_driver_handle_t driver = nullptr;
  std::vector<ze_device_handle_t> devices;
  ze_context_handle_t context = nullptr;
};

// zeInit, the driver, its devices and a context; false if any step fails.
bool OpenSession(ChildSession* s) {
  s->ze = LoadZe();
  if (s->ze == nullptr || s->ze->zeInit(0) != ZE_RESULT_SUCCESS) return false;
  uint32_t n = 1;
  if (s->ze->zeDriverGet(&n, &s->driver) != ZE_RESULT_SUCCESS || n != 1) return false;
  n = 0;
  if (s->ze->zeDeviceGet(s->driver, &n, nullptr) != ZE_RESULT_SUCCESS) return false;
  s->devices.resize(n);
  if (n > 0 && s->ze->zeDeviceGet(s->driver, &n, s->devices.data()) != ZE_RESULT_SUCCESS) {
    return false;
  }
  auto desc = Zeroed<ze_context_desc_t>(ZE_STRUCTURE_TYPE_CONTEXT_DESC);
  return s->ze->zeContextCreate(s->driver, &desc, &s->context) == ZE_RESULT_SUCCESS;
}

std::string DeviceUuid(const Ze* ze, ze_device_handle_t device) {
  auto props = Zeroed<ze_device_properties_t>(ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES);
  if (ze->zeDeviceGetProperties(device, &props) != ZE_RESULT_SUCCESS) return "";
  return Hex(props.uuid.id, sizeof(props.uuid.id));
}

// Receives a memory IPC handle (and the device UUID it belongs to) with its fd; opens it on
// the device of that UUID; reads it through a command-list copy and sends the bytes back;
// writes 0xC5 over its second half; closes.
int ChildOpenMemory(int sock) {
  std::string msg;
  UniqueFd fd;
  CHILD_REQUIRE(RecvMsg(sock, &msg, &fd));
  CHILD_REQUIRE(msg.size() == sizeof(ze_ipc_mem_handle_t) + 32 && fd.get() >= 0);
  ze_ipc_mem_handle_t handle;
  std::memcpy(handle.data, msg.data(), sizeof(handle.data));
  const std::string uuid = msg.substr(sizeof(handle.data));
  ChildSession s;
  CHILD_REQUIRE(OpenSession(&s));
  const Ze* ze = s.ze;
  ze_device_handle_t device = nullptr;
  for (ze_device_handle_t d : s.devices) {
    if (DeviceUuid(ze, d) == uuid) device = d;
  }
  CHILD_REQUIRE(device != nullptr);

  Report report;
  report.Add("received_fd_is_memfd", FdTarget(fd.get()).rfind("/memfd:", 0) == 0 ? "1" : "0");
  StoreU64(handle.data, static_cast<uint64_t>(fd.get()));  // the number this process got
  void* ptr = nullptr;
  CHILD_REQUIRE(ze->zeMemOpenIpcHandle(s.context, device, handle, 0, &ptr) == ZE_RESULT_SUCCESS);
  // A second open of the same memory maps it again.
  void* again = nullptr;
  report.Add("second_open", ze->zeMemOpenIpcHandle(s.context, device, handle, 0, &again));
  report.Add("second_open_distinct", again != nullptr && again != ptr ? "1" : "0");
  report.Add("ipc_open_after_two", Live("ipc_open"));
  report.Add("close_second", ze->zeMemCloseIpcHandle(s.context, again));
  fd = UniqueFd();  // the caller may close its fd once the memory is open

  auto props =
      Zeroed<ze_memory_allocation_properties_t>(ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES);
  ze_device_handle_t owner = nullptr;
  report.Add("props", ze->zeMemGetAllocProperties(s.context, ptr, &props, &owner));
  report.Add("props_type", static_cast<int64_t>(props.type));
  report.Add("props_device_matches", owner == device ? "1" : "0");
  size_t size = 0;
  report.Add("range", ze->zeMemGetAddressRange(s.context, ptr, nullptr, &size));
  report.Add("range_size", static_cast<int64_t>(size));

  ze_event_pool_desc_t pool_desc{ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, nullptr,
                                 ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 1};
  ze_event_pool_handle_t pool = nullptr;
  CHILD_REQUIRE(ze->zeEventPoolCreate(s.context, &pool_desc, 1, &device, &pool) ==
                ZE_RESULT_SUCCESS);
  auto event_desc = Zeroed<ze_event_desc_t>(ZE_STRUCTURE_TYPE_EVENT_DESC);
  event_desc.index = 0;
  ze_event_handle_t done = nullptr;
  CHILD_REQUIRE(ze->zeEventCreate(pool, &event_desc, &done) == ZE_RESULT_SUCCESS);
  ze_command_list_handle_t list = nullptr;
  const ze_command_queue_desc_t queue_desc = QueueDesc();
  CHILD_REQUIRE(ze->zeCommandListCreateImmediate(s.context, device, &queue_desc, &list) ==
                ZE_RESULT_SUCCESS);

  std::string data(size, '\0');
  CHILD_REQUIRE(ze->zeCommandListAppendMemoryCopy(list, data.data(), ptr, size, done, 0, nullptr) ==
                ZE_RESULT_SUCCESS);
  CHILD_REQUIRE(ze->zeEventHostSynchronize(done, kWaitNs) == ZE_RESULT_SUCCESS);
  CHILD_REQUIRE(tensord::common::testing::SendWithFd(sock, data));

  std::string mark(size / 2, '\xC5');
  CHILD_REQUIRE(ze->zeEventHostReset(done) == ZE_RESULT_SUCCESS);
  CHILD_REQUIRE(ze->zeCommandListAppendMemoryCopy(list, static_cast<char*>(ptr) + size / 2,
                                                  mark.data(), mark.size(), done, 0,
                                                  nullptr) == ZE_RESULT_SUCCESS);
  report.Add("write_back", ze->zeEventHostSynchronize(done, kWaitNs));

  report.Add("close", ze->zeMemCloseIpcHandle(s.context, ptr));
  report.Add("close_again", ze->zeMemCloseIpcHandle(s.context, ptr));
  report.Add("ipc_open_after_close", Live("ipc_open"));
  report.Add("ipc_opens_total", Live("ipc_opens_total"));
  CHILD_REQUIRE(ze->zeCommandListDestroy(list) == ZE_RESULT_SUCCESS);
  CHILD_REQUIRE(ze->zeEventDestroy(done) == ZE_RESULT_SUCCESS);
  CHILD_REQUIRE(ze->zeEventPoolDestroy(pool) == ZE_RESULT_SUCCESS);
  report.Add("context_destroy", ze->zeContextDestroy(s.context));
  CHILD_REQUIRE(tensord::common::testing::SendWithFd(sock, report.text()));
  return 0;
}

// Receives an IPC event pool handle with its fd (events 0..3; the parent signalled 3
// already). Its list waits on 0 (the parent signals it from a command list), then signals
// 1 (the parent's list waits on it); then it host-signals 2.
int ChildEvents(int sock) {
  std::string msg;
  UniqueFd fd;
  CHILD_REQUIRE(RecvMsg(sock, &msg, &fd));
  CHILD_REQUIRE(msg.size() == sizeof(ze_ipc_event_pool_handle_t) && fd.get() >= 0);
  ze_ipc_event_pool_handle_t handle;
  std::memcpy(handle.data, msg.data(), sizeof(handle.data));
  ChildSession s;
  CHILD_REQUIRE(OpenSession(&s) && !s.devices.empty());
  const Ze* ze = s.ze;

  StoreU64(handle.data, static_cast<uint64_t>(fd.get()));
  ze_event_pool_handle_t pool = nullptr;
  CHILD_REQUIRE(ze->zeEventPoolOpenIpcHandle(s.context, handle, &pool) == ZE_RESULT_SUCCESS);
  fd = UniqueFd();
  ze_event_handle_t events[4] = {};
  for (uint32_t i = 0; i < 4; ++i) {
    auto desc = Zeroed<ze_event_desc_t>(ZE_STRUCTURE_TYPE_EVENT_DESC);
    desc.index = i;
    CHILD_REQUIRE(ze->zeEventCreate(pool, &desc, &events[i]) == ZE_RESULT_SUCCESS);
  }
  Report report;
  report.Add("event_pool_open", Live("event_pool_open"));
  report.Add("ev0_at_open", ze->zeEventQueryStatus(events[0]));
  report.Add("ev3_at_open", ze->zeEventQueryStatus(events[3]));

  ze_command_list_handle_t list = nullptr;
  const ze_command_queue_desc_t queue_desc = QueueDesc();
  CHILD_REQUIRE(ze->zeCommandListCreateImmediate(s.context, s.devices[0], &queue_desc, &list) ==
                ZE_RESULT_SUCCESS);
  CHILD_REQUIRE(ze->zeCommandListAppendWaitOnEvents(list, 1, &events[0]) == ZE_RESULT_SUCCESS);
  CHILD_REQUIRE(ze->zeCommandListAppendSignalEvent(list, events[1]) == ZE_RESULT_SUCCESS);
  CHILD_REQUIRE(tensord::common::testing::SendWithFd(sock, "armed\n"));

  report.Add("ev1_signalled", ze->zeEventHostSynchronize(events[1], kWaitNs));
  report.Add("ev0_seen", ze->zeEventQueryStatus(events[0]));
  CHILD_REQUIRE(ze->zeEventHostSignal(events[2]) == ZE_RESULT_SUCCESS);
  CHILD_REQUIRE(ze->zeCommandListDestroy(list) == ZE_RESULT_SUCCESS);
  report.Add("close_in_use", ze->zeEventPoolCloseIpcHandle(pool));
  report.Add("destroy_opened", ze->zeEventPoolDestroy(pool));
  for (ze_event_handle_t event : events)
    CHILD_REQUIRE(ze->zeEventDestroy(event) == ZE_RESULT_SUCCESS);
  report.Add("close", ze->zeEventPoolCloseIpcHandle(pool));
  report.Add("event_pool_open_after", Live("event_pool_open"));
  report.Add("context_destroy", ze->zeContextDestroy(s.context));
  CHILD_REQUIRE(tensord::common::testing::SendWithFd(sock, report.text()));
  return 0;
}

// zeInit under the environment the parent chose, and what it finds: devices, UUIDs, names,
// memory, allocation limits, and opening a handle on the wrong device.
int ChildProbe(int sock) {
  Report report;
  const Ze* ze = LoadZe();
  CHILD_REQUIRE(ze != nullptr);
  const ze_result_t init = ze->zeInit(0);
  report.Add("init", init);
  uint32_t drivers = 0;
  report.Add("driver_get", ze->zeDriverGet(&drivers, nullptr));
  report.Add("drivers", static_cast<int64_t>(drivers));
  if (init != ZE_RESULT_SUCCESS) {
    CHILD_REQUIRE(tensord::common::testing::SendWithFd(sock, report.text()));
    return 0;
  }
  ChildSession s;
  CHILD_REQUIRE(OpenSession(&s));
  report.Add("devices", static_cast<int64_t>(s.devices.size()));
  for (size_t i = 0; i < s.devices.size(); ++i) {
    auto props = Zeroed<ze_device_properties_t>(ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES);
    CHILD_REQUIRE(ze->zeDeviceGetProperties(s.devices[i], &props) == ZE_RESULT_SUCCESS);
    auto memory = Zeroed<ze_device_memory_properties_t>(ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES);
    uint32_t count = 1;
    CHILD_REQUIRE(ze->zeDeviceGetMemoryProperties(s.devices[i], &count, &memory) ==
                  ZE_RESULT_SUCCESS);
    const std::string n = std::to_string(i);
    report.Add("uuid" + n, Hex(props.uuid.id, sizeof(props.uuid.id)));
    report.Add("name" + n, props.name);
    report.Add("memory" + n, static_cast<int64_t>(memory.totalSize));
  }
  if (!s.devices.empty()) {
    auto memory = Zeroed<ze_device_memory_properties_t>(ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES);
    uint32_t count = 1;
    CHILD_REQUIRE(ze->zeDeviceGetMemoryProperties(s.devices[0], &count, &memory) ==
                  ZE_RESULT_SUCCESS);
    const size_t total = memory.totalSize;
    auto desc = Zeroed<ze_device_mem_alloc_desc_t>(ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC);
    void* big = nullptr;
    void* more = nullptr;
    report.Add("alloc_oversize",
               ze->zeMemAllocDevice(s.context, &desc, total + 1, 0, s.devices[0], &big));
    report.Add("alloc_three_quarters",
               ze->zeMemAllocDevice(s.context, &desc, total / 4 * 3, 0, s.devices[0], &big));
    report.Add("alloc_half_more",
               ze->zeMemAllocDevice(s.context, &desc, total / 2, 0, s.devices[0], &more));
    if (s.devices.size() > 1) {
      // Memory is per device: another device still has all of its own.
      void* other = nullptr;
      report.Add("alloc_half_other_device",
                 ze->zeMemAllocDevice(s.context, &desc, total / 2, 0, s.devices[1], &other));
      ze_ipc_mem_handle_t handle{};
      CHILD_REQUIRE(ze->zeMemGetIpcHandle(s.context, big, &handle) == ZE_RESULT_SUCCESS);
      void* opened = nullptr;
      report.Add("open_on_other_device",
                 ze->zeMemOpenIpcHandle(s.context, s.devices[1], handle, 0, &opened));
      report.Add("open_on_own_device",
                 ze->zeMemOpenIpcHandle(s.context, s.devices[0], handle, 0, &opened));
      CHILD_REQUIRE(ze->zeMemCloseIpcHandle(s.context, opened) == ZE_RESULT_SUCCESS);
      CHILD_REQUIRE(ze->zeMemFree(s.context, other) == ZE_RESULT_SUCCESS);
    }
    CHILD_REQUIRE(ze->zeMemFree(s.context, big) == ZE_RESULT_SUCCESS);
    report.Add("alloc_half_after_free",
               ze->zeMemAllocDevice(s.context, &desc, total / 2, 0, s.devices[0], &more));
    CHILD_REQUIRE(ze->zeMemFree(s.context, more) == ZE_RESULT_SUCCESS);
  }
  report.Add("context_destroy", ze->zeContextDestroy(s.context));
  CHILD_REQUIRE(tensord::common::testing::SendWithFd(sock, report.text()));
  return 0;
}

// In a helper process, runs its role and exits before main(); in the test, does nothing.
[[maybe_unused]] const bool kHelperRan = [] {
  const char* role = std::getenv(kRoleEnv);
  const char* sock_text = std::getenv(kSockEnv);
  if (role == nullptr || sock_text == nullptr) return false;
  const int sock = std::atoi(sock_text);
  int code = 3;
  if (std::strcmp(role, "open_memory") == 0) code = ChildOpenMemory(sock);
  if (std::strcmp(role, "events") == 0) code = ChildEvents(sock);
  if (std::strcmp(role, "probe") == 0) code = ChildProbe(sock);
  ::_exit(code);  // no static destructors: the loader's, and the fake's threads, stay put
}();

// ---- The parent's side of a helper --------------------------------------------------------

struct Helper {
  pid_t pid = -1;
  UniqueFd sock;

  Helper() = default;
  Helper(Helper&& other) noexcept
      : pid(std::exchange(other.pid, -1)), sock(std::move(other.sock)) {}

  // The exit code, or -1 if it did not exit by itself.
  int Wait() {
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Helper() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

// This binary again in `role`, with `env` ("NAME=value") over the test's environment and
// the other end of a SOCK_SEQPACKET socketpair. The driver's memfds are MFD_CLOEXEC: the
// helper gets an fd only if one is sent to it.
Helper Spawn(const std::string& role, const std::vector<std::string>& env) {
  Helper helper;
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0) return helper;
  UniqueFd child_end(ends[1]);
  helper.sock = UniqueFd(ends[0]);

  std::vector<std::string> vars = env;
  vars.push_back(std::string(kRoleEnv) + "=" + role);
  vars.push_back(std::string(kSockEnv) + "=" + std::to_string(child_end.get()));
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    const std::string name = var.substr(0, var.find('='));
    bool overridden = false;
    for (const std::string& v : vars) overridden = overridden || v.rfind(name + "=", 0) == 0;
    if (!overridden) vars.push_back(var);
  }
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return helper;
  std::string self(path, static_cast<size_t>(n));
  char* argv[] = {self.data(), nullptr};

  const pid_t pid = ::fork();
  if (pid == 0) {
    // Async-signal-safe only, until exec: the parent has threads (the fake's workers).
    ::fcntl(child_end.get(), F_SETFD, 0);
    ::execve(self.c_str(), argv, envp.data());
    ::_exit(127);
  }
  helper.pid = pid;
  return helper;
}

// A probe helper's report under `env`.
std::map<std::string, std::string> Probe(const std::vector<std::string>& env, int* exit_code) {
  Helper helper = Spawn("probe", env);
  std::string text;
  const bool got = helper.pid > 0 && RecvMsg(helper.sock.get(), &text);
  *exit_code = helper.Wait();
  return got ? ParseReport(text) : std::map<std::string, std::string>{};
}

// ---- The tests -----------------------------------------------------------------------------

class FakeZeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ze = LoadZe();
    ASSERT_NE(ze, nullptr) << "the real loader, libze_loader.so.1, with every function used";
    ASSERT_EQ(ze->zeInit(0), ZE_RESULT_SUCCESS);
    // Counted before this test's objects, so that a test that failed half-way and leaked
    // does not fail the ones after it.
    for (const char* kind : kLiveKinds) baseline[kind] = Live(kind);
    uint32_t n = 1;
    ASSERT_EQ(ze->zeDriverGet(&n, &driver), ZE_RESULT_SUCCESS);
    ASSERT_EQ(n, 1u);
    n = 1;
    ASSERT_EQ(ze->zeDeviceGet(driver, &n, &device), ZE_RESULT_SUCCESS);
    ASSERT_EQ(n, 1u);
    context = NewContext();
    ASSERT_NE(context, nullptr);
    pool = NewPool(context, ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 1);
    ASSERT_NE(pool, nullptr);
    done = NewEvent(pool, 0);
    list = NewImmediateList(context);
    ASSERT_NE(list, nullptr);
  }

  void TearDown() override {
    if (ze == nullptr) return;
    if (list != nullptr) {
      EXPECT_EQ(ze->zeCommandListDestroy(list), ZE_RESULT_SUCCESS);
    }
    if (done != nullptr) {
      EXPECT_EQ(ze->zeEventDestroy(done), ZE_RESULT_SUCCESS);
    }
    if (pool != nullptr) {
      EXPECT_EQ(ze->zeEventPoolDestroy(pool), ZE_RESULT_SUCCESS);
    }
    if (context != nullptr) {
      EXPECT_EQ(ze->zeContextDestroy(context), ZE_RESULT_SUCCESS);
    }
    // Every test leaves nothing behind.
    for (const char* kind : kLiveKinds) EXPECT_EQ(Live(kind), baseline[kind]) << kind;
  }

  // The number of live objects of `kind` this test added.
  int64_t Added(const char* kind) { return Live(kind) - baseline[kind]; }

  ze_context_handle_t NewContext() {
    auto desc = Zeroed<ze_context_desc_t>(ZE_STRUCTURE_TYPE_CONTEXT_DESC);
    ze_context_handle_t c = nullptr;
    EXPECT_EQ(ze->zeContextCreate(driver, &desc, &c), ZE_RESULT_SUCCESS);
    return c;
  }

  ze_event_pool_handle_t NewPool(ze_context_handle_t c, ze_event_pool_flags_t flags,
                                 uint32_t count) {
    ze_event_pool_desc_t desc{ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, nullptr, flags, count};
    ze_event_pool_handle_t p = nullptr;
    EXPECT_EQ(ze->zeEventPoolCreate(c, &desc, 1, &device, &p), ZE_RESULT_SUCCESS);
    return p;
  }

  ze_event_handle_t NewEvent(ze_event_pool_handle_t p, uint32_t index) {
    auto desc = Zeroed<ze_event_desc_t>(ZE_STRUCTURE_TYPE_EVENT_DESC);
    desc.index = index;
    ze_event_handle_t e = nullptr;
    EXPECT_EQ(ze->zeEventCreate(p, &desc, &e), ZE_RESULT_SUCCESS);
    return e;
  }

  ze_command_list_handle_t NewImmediateList(
      ze_context_handle_t c, ze_command_queue_mode_t mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS) {
    const ze_command_queue_desc_t desc = QueueDesc(mode);
    ze_command_list_handle_t l = nullptr;
    EXPECT_EQ(ze->zeCommandListCreateImmediate(c, device, &desc, &l), ZE_RESULT_SUCCESS);
    return l;
  }

  void* AllocDevice(ze_context_handle_t c, size_t size, size_t alignment = 0) {
    auto desc = Zeroed<ze_device_mem_alloc_desc_t>(ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC);
    void* ptr = nullptr;
    EXPECT_EQ(ze->zeMemAllocDevice(c, &desc, size, alignment, device, &ptr), ZE_RESULT_SUCCESS);
    return ptr;
  }

  // A copy on `list` (this test's context), waited for.
  ze_result_t CopyAndWait(void* dst, const void* src, size_t size) {
    if (ze_result_t r = ze->zeEventHostReset(done); r != ZE_RESULT_SUCCESS) return r;
    if (ze_result_t r = ze->zeCommandListAppendMemoryCopy(list, dst, src, size, done, 0, nullptr);
        r != ZE_RESULT_SUCCESS) {
      return r;
    }
    return ze->zeEventHostSynchronize(done, kWaitNs);
  }

  const Ze* ze = nullptr;
  ze_driver_handle_t driver = nullptr;
  ze_device_handle_t device = nullptr;
  ze_context_handle_t context = nullptr;
  ze_event_pool_handle_t pool = nullptr;
  ze_event_handle_t done = nullptr;  // index 0 of `pool`, for CopyAndWait
  ze_command_list_handle_t list = nullptr;
  std::map<std::string, int64_t> baseline;
};

TEST_F(FakeZeTest, LoaderLoadsTheFakeAndPassesItsTablesThrough) {
  // The library the loader loaded is the fake, found where ZE_ENABLE_ALT_DRIVERS says.
  void* lib = ::dlopen(std::getenv("ZE_ENABLE_ALT_DRIVERS"), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  ::dlclose(lib);
  EXPECT_EQ(Added("context"), 1);

  ze_api_version_t version{};
  EXPECT_EQ(ze->zeDriverGetApiVersion(driver, &version), ZE_RESULT_SUCCESS);
  EXPECT_EQ(version, ZE_API_VERSION_1_4);
  auto driver_props = Zeroed<ze_driver_properties_t>(ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES);
  ASSERT_EQ(ze->zeDriverGetProperties(driver, &driver_props), ZE_RESULT_SUCCESS);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(driver_props.uuid.id)), "tensord-fake-ze");
  EXPECT_EQ(driver_props.driverVersion, 1u);
  auto ipc = Zeroed<ze_driver_ipc_properties_t>(ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES);
  ASSERT_EQ(ze->zeDriverGetIpcProperties(driver, &ipc), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ipc.flags, ZE_IPC_PROPERTY_FLAG_MEMORY | ZE_IPC_PROPERTY_FLAG_EVENT_POOL);
  uint32_t extensions = 7;
  EXPECT_EQ(ze->zeDriverGetExtensionProperties(driver, &extensions, nullptr), ZE_RESULT_SUCCESS);
  EXPECT_EQ(extensions, 0u);
  void* function = &extensions;
  EXPECT_EQ(ze->zeDriverGetExtensionFunctionAddress(driver, "zexMemGetIpcHandles", &function),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(function, nullptr);

  auto props = Zeroed<ze_device_properties_t>(ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES);
  ASSERT_EQ(ze->zeDeviceGetProperties(device, &props), ZE_RESULT_SUCCESS);
  EXPECT_EQ(props.stype, ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES);
  EXPECT_EQ(props.type, ZE_DEVICE_TYPE_GPU);
  EXPECT_EQ(props.vendorId, 0x7e57u);
  EXPECT_EQ(props.flags, 0u);
  EXPECT_EQ(props.maxMemAllocSize, 1ull << 30);
  EXPECT_STREQ(props.name, "tensord fake Level Zero device 0");
  EXPECT_EQ(Hex(props.uuid.id, sizeof(props.uuid.id)),
            Hex(reinterpret_cast<const uint8_t*>("zefake-tensord\0"), 16));

  uint32_t count = 0;
  ASSERT_EQ(ze->zeDeviceGetMemoryProperties(device, &count, nullptr), ZE_RESULT_SUCCESS);
  EXPECT_EQ(count, 1u);
  auto memory = Zeroed<ze_device_memory_properties_t>(ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES);
  ASSERT_EQ(ze->zeDeviceGetMemoryProperties(device, &count, &memory), ZE_RESULT_SUCCESS);
  EXPECT_EQ(memory.totalSize, 1ull << 30);
  count = 5;
  ASSERT_EQ(ze->zeDeviceGetSubDevices(device, &count, nullptr), ZE_RESULT_SUCCESS);
  EXPECT_EQ(count, 0u);
  count = 0;
  ASSERT_EQ(ze->zeDeviceGetCommandQueueGroupProperties(device, &count, nullptr), ZE_RESULT_SUCCESS);
  ASSERT_EQ(count, 1u);
  auto group =
      Zeroed<ze_command_queue_group_properties_t>(ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES);
  ASSERT_EQ(ze->zeDeviceGetCommandQueueGroupProperties(device, &count, &group), ZE_RESULT_SUCCESS);
  EXPECT_EQ(group.flags, ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE |
                             ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY);
  EXPECT_EQ(group.numQueues, 1u);
  EXPECT_EQ(ze->zeContextGetStatus(context), ZE_RESULT_SUCCESS);

  // An entry the fake leaves empty: the loader's lib answers for it.
  auto module_desc = Zeroed<ze_module_desc_t>(ZE_STRUCTURE_TYPE_MODULE_DESC);
  ze_module_handle_t module = nullptr;
  EXPECT_EQ(ze->zeModuleCreate(context, device, &module_desc, &module, nullptr),
            ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
}

TEST_F(FakeZeTest, DeviceMemoryIsWrittenAndReadThroughCommandLists) {
  constexpr size_t kSize = 3 * 4096 + 100;
  void* mem = AllocDevice(context, kSize);
  ASSERT_NE(mem, nullptr);
  EXPECT_EQ(Added("allocation"), 1);
  const std::vector<uint8_t> in = Pattern(kSize, 3);
  ASSERT_EQ(CopyAndWait(mem, in.data(), kSize), ZE_RESULT_SUCCESS);
  std::vector<uint8_t> out(kSize);
  ASSERT_EQ(CopyAndWait(out.data(), mem, kSize), ZE_RESULT_SUCCESS);
  EXPECT_EQ(out, in);

  // A fill (16-byte patterns at most, a power of two), then a device-to-device copy.
  const uint32_t word = 0xA1B2C3D4;
  ASSERT_EQ(ze->zeEventHostReset(done), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeCommandListAppendMemoryFill(list, mem, &word, 3, 64, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_SIZE);
  EXPECT_EQ(ze->zeCommandListAppendMemoryFill(list, mem, &word, 32, 64, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_SIZE);
  ASSERT_EQ(
      ze->zeCommandListAppendMemoryFill(list, mem, &word, sizeof(word), 4096, done, 0, nullptr),
      ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeEventHostSynchronize(done, kWaitNs), ZE_RESULT_SUCCESS);
  void* other = AllocDevice(context, 4096);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(CopyAndWait(other, mem, 4096), ZE_RESULT_SUCCESS);
  std::vector<uint32_t> words(1024);
  ASSERT_EQ(CopyAndWait(words.data(), other, 4096), ZE_RESULT_SUCCESS);
  EXPECT_EQ(words, std::vector<uint32_t>(1024, word));
  ASSERT_EQ(CopyAndWait(out.data(), mem, kSize), ZE_RESULT_SUCCESS);
  EXPECT_TRUE(std::equal(out.begin() + 4096, out.end(), in.begin() + 4096)) << "fill overran";

  // A copy must stay inside the allocation it starts in.
  EXPECT_EQ(ze->zeCommandListAppendMemoryCopy(list, out.data(), static_cast<char*>(mem) + 100,
                                              kSize, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_SIZE);
  EXPECT_EQ(ze->zeMemFree(context, other), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeMemFree(context, mem), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeMemFree(context, mem), ZE_RESULT_ERROR_INVALID_ARGUMENT);
}

TEST_F(FakeZeTest, AllocationPropertiesRangesAndLimits) {
  void* mem = AllocDevice(context, 10000, 1 << 20);
  ASSERT_NE(mem, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(mem) % (1 << 20), 0u) << "alignment";
  void* mem2 = AllocDevice(context, 64);
  ASSERT_NE(mem2, nullptr);
  void* host = nullptr;
  auto host_desc = Zeroed<ze_host_mem_alloc_desc_t>(ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC);
  ASSERT_EQ(ze->zeMemAllocHost(context, &host_desc, 5000, 0, &host), ZE_RESULT_SUCCESS);
  EXPECT_EQ(Added("host_allocation"), 1);

  auto props =
      Zeroed<ze_memory_allocation_properties_t>(ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES);
  ze_device_handle_t owner = nullptr;
  ASSERT_EQ(ze->zeMemGetAllocProperties(context, static_cast<char*>(mem) + 9999, &props, &owner),
            ZE_RESULT_SUCCESS);
  EXPECT_EQ(props.type, ZE_MEMORY_TYPE_DEVICE);
  EXPECT_EQ(owner, device);
  const uint64_t id = props.id;
  ASSERT_EQ(ze->zeMemGetAllocProperties(context, mem2, &props, nullptr), ZE_RESULT_SUCCESS);
  EXPECT_NE(props.id, id);
  ASSERT_EQ(ze->zeMemGetAllocProperties(context, host, &props, &owner), ZE_RESULT_SUCCESS);
  EXPECT_EQ(props.type, ZE_MEMORY_TYPE_HOST);
  EXPECT_EQ(owner, nullptr);
  int on_stack = 0;
  ASSERT_EQ(ze->zeMemGetAllocProperties(context, &on_stack, &props, nullptr), ZE_RESULT_SUCCESS);
  EXPECT_EQ(props.type, ZE_MEMORY_TYPE_UNKNOWN);
  ASSERT_EQ(ze->zeMemGetAllocProperties(context, static_cast<char*>(mem) + 10000, &props, nullptr),
            ZE_RESULT_SUCCESS);
  EXPECT_EQ(props.type, ZE_MEMORY_TYPE_UNKNOWN) << "one past the end";
  // Another context's memory is "unknown", as the spec says.
  ze_context_handle_t other = NewContext();
  ASSERT_EQ(ze->zeMemGetAllocProperties(other, mem, &props, nullptr), ZE_RESULT_SUCCESS);
  EXPECT_EQ(props.type, ZE_MEMORY_TYPE_UNKNOWN);

  void* base = nullptr;
  size_t size = 0;
  ASSERT_EQ(ze->zeMemGetAddressRange(context, static_cast<char*>(mem) + 4097, &base, &size),
            ZE_RESULT_SUCCESS);
  EXPECT_EQ(base, mem);
  EXPECT_EQ(size, 10000u);
  EXPECT_EQ(ze->zeMemGetAddressRange(context, &on_stack, &base, &size), ZE_RESULT_ERROR_UNKNOWN);
  EXPECT_EQ(ze->zeMemGetAddressRange(other, mem, &base, &size), ZE_RESULT_ERROR_UNKNOWN);

  auto desc = Zeroed<ze_device_mem_alloc_desc_t>(ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC);
  void* bad = nullptr;
  EXPECT_EQ(ze->zeMemAllocDevice(context, &desc, 0, 0, device, &bad),
            ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
  EXPECT_EQ(ze->zeMemAllocDevice(context, &desc, 64, 48, device, &bad),
            ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
  EXPECT_EQ(ze->zeMemAllocDevice(context, &desc, (1ull << 30) + 1, 0, device, &bad),
            ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
  EXPECT_EQ(ze->zeMemAllocDevice(context, &desc, 1ull << 30, 0, device, &bad),
            ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)
      << "1 GiB minus what this test holds is left";

  // zeMemFree: an allocation's base, in its own context.
  EXPECT_EQ(ze->zeMemFree(context, static_cast<char*>(mem) + 1), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ze->zeMemFree(context, &on_stack), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ze->zeMemFree(other, mem), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ze->zeContextDestroy(context), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
  EXPECT_EQ(ze->zeMemFree(context, host), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeMemFree(context, mem2), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeMemFree(context, mem), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeContextDestroy(other), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeContextGetStatus(other), ZE_RESULT_ERROR_INVALID_ARGUMENT);
}

TEST_F(FakeZeTest, MemoryIpcHandleOpensInAnotherProcess) {
  constexpr size_t kSize = 64 << 10;
  void* mem = AllocDevice(context, kSize);
  ASSERT_NE(mem, nullptr);
  const std::vector<uint8_t> in = Pattern(kSize, 11);
  ASSERT_EQ(CopyAndWait(mem, in.data(), kSize), ZE_RESULT_SUCCESS);

  ze_ipc_mem_handle_t handle{};
  ASSERT_EQ(ze->zeMemGetIpcHandle(context, mem, &handle), ZE_RESULT_SUCCESS);
  EXPECT_EQ(std::string(handle.data + 16, 4), "FZEM");
  EXPECT_EQ(LoadU64(handle.data + 8), kSize);
  EXPECT_EQ(LoadU64(handle.data + 20) & 0xffffffffu, 0u) << "device index";
  EXPECT_EQ(LoadU64(handle.data + 24), 0u) << "offset";
  const int fd = static_cast<int>(LoadU64(handle.data));
  EXPECT_EQ(FdTarget(fd).rfind("/memfd:", 0), 0u) << FdTarget(fd);
  ze_ipc_mem_handle_t again{};
  ASSERT_EQ(ze->zeMemGetIpcHandle(context, mem, &again), ZE_RESULT_SUCCESS);
  EXPECT_EQ(std::memcmp(handle.data, again.data, sizeof(handle.data)), 0) << "same fd each call";
  // The spec: the allocation's base only, and of this context.
  EXPECT_EQ(ze->zeMemGetIpcHandle(context, static_cast<char*>(mem) + 64, &again),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);

  auto props = Zeroed<ze_device_properties_t>(ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES);
  ASSERT_EQ(ze->zeDeviceGetProperties(device, &props), ZE_RESULT_SUCCESS);
  const std::string uuid = Hex(props.uuid.id, sizeof(props.uuid.id));

  Helper helper = Spawn("open_memory", {});
  ASSERT_GT(helper.pid, 0);
  // As a real exporter would: the handle bytes, and the fd beside them over SCM_RIGHTS.
  ASSERT_TRUE(tensord::common::testing::SendWithFd(helper.sock.get(), std::string(handle.data, sizeof(handle.data)) + uuid, fd));
  std::string data;
  ASSERT_TRUE(RecvMsg(helper.sock.get(), &data));
  std::string text;
  ASSERT_TRUE(RecvMsg(helper.sock.get(), &text));
  EXPECT_EQ(helper.Wait(), 0) << text;
  ASSERT_EQ(data.size(), kSize) << data;
  EXPECT_EQ(std::memcmp(data.data(), in.data(), kSize), 0) << "the helper read other bytes";

  auto report = ParseReport(text);
  EXPECT_EQ(report["received_fd_is_memfd"], "1");
  EXPECT_EQ(report["second_open"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["second_open_distinct"], "1");
  EXPECT_EQ(report["ipc_open_after_two"], "2");
  EXPECT_EQ(report["close_second"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["props"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["props_type"], std::to_string(ZE_MEMORY_TYPE_DEVICE));
  EXPECT_EQ(report["props_device_matches"], "1");
  EXPECT_EQ(report["range_size"], std::to_string(kSize));
  EXPECT_EQ(report["write_back"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["close"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["close_again"], Str(ZE_RESULT_ERROR_INVALID_ARGUMENT));
  EXPECT_EQ(report["ipc_open_after_close"], "0");
  EXPECT_EQ(report["ipc_opens_total"], "2");
  EXPECT_EQ(report["context_destroy"], Str(ZE_RESULT_SUCCESS));

  // The helper's writes landed in this process's allocation: one memory, two mappings.
  std::vector<uint8_t> out(kSize);
  ASSERT_EQ(CopyAndWait(out.data(), mem, kSize), ZE_RESULT_SUCCESS);
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + kSize / 2, in.begin()));
  EXPECT_EQ(std::vector<uint8_t>(out.begin() + kSize / 2, out.end()),
            std::vector<uint8_t>(kSize / 2, 0xC5));

  // The fd is the driver's: valid until zeMemFree closes it.
  EXPECT_EQ(::fcntl(fd, F_GETFD), FD_CLOEXEC);
  EXPECT_EQ(ze->zeMemFree(context, mem), ZE_RESULT_SUCCESS);
  EXPECT_EQ(::fcntl(fd, F_GETFD), -1);
}

TEST_F(FakeZeTest, OpenedMemoryBelongsToTheContextItWasOpenedIn) {
  constexpr size_t kSize = 8192;
  void* mem = AllocDevice(context, kSize);
  ASSERT_NE(mem, nullptr);
  const std::vector<uint8_t> in = Pattern(kSize, 5);
  ASSERT_EQ(CopyAndWait(mem, in.data(), kSize), ZE_RESULT_SUCCESS);
  ze_ipc_mem_handle_t handle{};
  ASSERT_EQ(ze->zeMemGetIpcHandle(context, mem, &handle), ZE_RESULT_SUCCESS);

  // tensord opens handles in a context a program hands it: B, not the exporter's A.
  ze_context_handle_t other = NewContext();
  ze_command_list_handle_t other_list = NewImmediateList(other);
  ASSERT_NE(other_list, nullptr);
  EXPECT_EQ(ze->zeMemGetIpcHandle(other, mem, &handle), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  const int64_t total_before = Live("ipc_opens_total");
  void* opened = nullptr;
  void* opened2 = nullptr;
  ASSERT_EQ(ze->zeMemOpenIpcHandle(other, device, handle, 0, &opened), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeMemOpenIpcHandle(other, device, handle, 0, &opened2), ZE_RESULT_SUCCESS);
  EXPECT_NE(opened, opened2);
  EXPECT_NE(opened, mem);
  EXPECT_EQ(Added("ipc_open"), 2);
  EXPECT_EQ(Live("ipc_opens_total"), total_before + 2);

  std::vector<uint8_t> out(kSize);
  // The exporter's context cannot use the opened pointer, nor B's list A's allocation.
  EXPECT_EQ(ze->zeCommandListAppendMemoryCopy(list, out.data(), opened, kSize, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(
      ze->zeCommandListAppendMemoryCopy(other_list, out.data(), mem, kSize, nullptr, 0, nullptr),
      ZE_RESULT_ERROR_INVALID_ARGUMENT);
  // Nor B's list A's event.
  EXPECT_EQ(
      ze->zeCommandListAppendMemoryCopy(other_list, out.data(), opened, kSize, done, 0, nullptr),
      ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ze->zeCommandListAppendSignalEvent(other_list, done), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ze->zeCommandListAppendWaitOnEvents(other_list, 1, &done),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);

  ze_event_pool_handle_t other_pool = NewPool(other, ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 1);
  ze_event_handle_t other_done = NewEvent(other_pool, 0);
  ASSERT_EQ(ze->zeCommandListAppendMemoryCopy(other_list, out.data(), opened2, kSize, other_done, 0,
                                              nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeEventHostSynchronize(other_done, kWaitNs), ZE_RESULT_SUCCESS);
  EXPECT_EQ(out, in);
  auto props =
      Zeroed<ze_memory_allocation_properties_t>(ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES);
  ASSERT_EQ(ze->zeMemGetAllocProperties(other, opened, &props, nullptr), ZE_RESULT_SUCCESS);
  EXPECT_EQ(props.type, ZE_MEMORY_TYPE_DEVICE);

  // Opened memory goes back with zeMemCloseIpcHandle, in its own context.
  EXPECT_EQ(ze->zeMemFree(other, opened), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ze->zeMemCloseIpcHandle(context, opened), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ze->zeMemCloseIpcHandle(other, mem), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ze->zeContextDestroy(other), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
  EXPECT_EQ(ze->zeMemCloseIpcHandle(other, opened), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeMemCloseIpcHandle(other, opened2), ZE_RESULT_SUCCESS);
  EXPECT_EQ(Added("ipc_open"), 0);

  // Handles that name no memfd of the size, or another device's memory, do not open.
  ze_ipc_mem_handle_t bad = handle;
  bad.data[16] = 'X';
  EXPECT_EQ(ze->zeMemOpenIpcHandle(other, device, bad, 0, &opened),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  bad = handle;
  StoreU64(bad.data + 8, kSize * 2);
  EXPECT_EQ(ze->zeMemOpenIpcHandle(other, device, bad, 0, &opened),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  UniqueFd null_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
  bad = handle;
  StoreU64(bad.data, static_cast<uint64_t>(null_fd.get()));
  EXPECT_EQ(ze->zeMemOpenIpcHandle(other, device, bad, 0, &opened),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  bad = handle;
  bad.data[20] = 1;
  EXPECT_EQ(ze->zeMemOpenIpcHandle(other, device, bad, 0, &opened),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ze->zeMemOpenIpcHandle(other, device, handle, 4, &opened),
            ZE_RESULT_ERROR_INVALID_ENUMERATION);
  EXPECT_EQ(Added("ipc_open"), 0);

  EXPECT_EQ(ze->zeCommandListDestroy(other_list), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventDestroy(other_done), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventPoolDestroy(other_pool), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeContextDestroy(other), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeMemFree(context, mem), ZE_RESULT_SUCCESS);
}

TEST_F(FakeZeTest, AWaitOnAnUnsignalledEventStallsLaterCommands) {
  ze_event_pool_handle_t events = NewPool(context, ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 3);
  ze_event_handle_t gate = NewEvent(events, 0);
  ze_event_handle_t copied = NewEvent(events, 1);
  ze_event_handle_t gate2 = NewEvent(events, 2);
  const std::vector<uint8_t> src = Pattern(4096, 1);
  std::vector<uint8_t> dst(4096, 0);
  std::vector<uint8_t> dst2(4096, 0);

  ASSERT_EQ(ze->zeCommandListAppendWaitOnEvents(list, 1, &gate), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeCommandListAppendMemoryCopy(list, dst.data(), src.data(), src.size(), copied, 0,
                                              nullptr),
            ZE_RESULT_SUCCESS);
  // The same, through a copy's own wait list, behind the first.
  ASSERT_EQ(
      ze->zeCommandListAppendMemoryCopy(list, dst2.data(), src.data(), src.size(), done, 1, &gate2),
      ZE_RESULT_SUCCESS);
  std::this_thread::sleep_for(kStallCheck);
  EXPECT_EQ(ze->zeEventQueryStatus(copied), ZE_RESULT_NOT_READY);
  EXPECT_EQ(ze->zeEventHostSynchronize(copied, 1'000'000), ZE_RESULT_NOT_READY);
  EXPECT_EQ(dst, std::vector<uint8_t>(4096, 0)) << "the copy ran before its wait";

  ASSERT_EQ(ze->zeEventHostSignal(gate), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeEventHostSynchronize(copied, kWaitNs), ZE_RESULT_SUCCESS);
  EXPECT_EQ(dst, src);
  std::this_thread::sleep_for(kStallCheck);
  EXPECT_EQ(ze->zeEventQueryStatus(done), ZE_RESULT_NOT_READY);
  EXPECT_EQ(dst2, std::vector<uint8_t>(4096, 0));
  ASSERT_EQ(ze->zeEventHostSignal(gate2), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeEventHostSynchronize(done, kWaitNs), ZE_RESULT_SUCCESS);
  EXPECT_EQ(dst2, src);

  // Resets and barriers run in order too.
  ASSERT_EQ(ze->zeEventHostReset(done), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeCommandListAppendEventReset(list, gate), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeCommandListAppendBarrier(list, done, 1, &copied), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeEventHostSynchronize(done, kWaitNs), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventQueryStatus(gate), ZE_RESULT_NOT_READY);
  EXPECT_EQ(ze->zeCommandListAppendBarrier(list, nullptr, 1, nullptr),
            ZE_RESULT_ERROR_INVALID_SIZE);

  // A synchronous immediate list has run a command when the append returns.
  ze_command_list_handle_t sync_list = NewImmediateList(context, ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS);
  std::vector<uint8_t> dst3(4096, 0);
  ASSERT_EQ(ze->zeCommandListAppendMemoryCopy(sync_list, dst3.data(), src.data(), src.size(),
                                              nullptr, 0, nullptr),
            ZE_RESULT_SUCCESS);
  EXPECT_EQ(dst3, src);
  EXPECT_EQ(ze->zeCommandListDestroy(sync_list), ZE_RESULT_SUCCESS);

  for (ze_event_handle_t e : {gate, copied, gate2})
    EXPECT_EQ(ze->zeEventDestroy(e), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventPoolDestroy(events), ZE_RESULT_SUCCESS);
}

TEST_F(FakeZeTest, RegularListsRunOnACommandQueue) {
  constexpr size_t kSize = 4096;
  void* mem = AllocDevice(context, kSize);
  ASSERT_NE(mem, nullptr);
  ze_event_pool_handle_t events = NewPool(context, ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 1);
  ze_event_handle_t gate = NewEvent(events, 0);
  auto list_desc = Zeroed<ze_command_list_desc_t>(ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC);
  ze_command_list_handle_t regular = nullptr;
  ASSERT_EQ(ze->zeCommandListCreate(context, device, &list_desc, &regular), ZE_RESULT_SUCCESS);
  const uint16_t half = 0xBEEF;
  std::vector<uint16_t> out(kSize / 2, 0);
  ASSERT_EQ(ze->zeCommandListAppendWaitOnEvents(regular, 1, &gate), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeCommandListAppendMemoryFill(regular, mem, &half, sizeof(half), kSize, nullptr, 0,
                                              nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeCommandListAppendMemoryCopy(regular, out.data(), mem, kSize, nullptr, 0, nullptr),
            ZE_RESULT_SUCCESS);

  const ze_command_queue_desc_t queue_desc = QueueDesc();
  ze_command_queue_handle_t queue = nullptr;
  ASSERT_EQ(ze->zeCommandQueueCreate(context, device, &queue_desc, &queue), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeCommandQueueExecuteCommandLists(queue, 1, &regular, nullptr),
            ZE_RESULT_ERROR_INVALID_ARGUMENT)
      << "not closed";
  EXPECT_EQ(ze->zeCommandQueueExecuteCommandLists(queue, 1, &list, nullptr),
            ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE);
  ASSERT_EQ(ze->zeCommandListClose(regular), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeCommandListAppendBarrier(regular, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_ARGUMENT)
      << "closed";
  std::this_thread::sleep_for(kStallCheck);
  EXPECT_EQ(out[0], 0) << "recorded, not run";

  ASSERT_EQ(ze->zeCommandQueueExecuteCommandLists(queue, 1, &regular, nullptr), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeCommandQueueSynchronize(queue, 1'000'000), ZE_RESULT_NOT_READY);
  ASSERT_EQ(ze->zeEventHostSignal(gate), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeCommandQueueSynchronize(queue, UINT64_MAX), ZE_RESULT_SUCCESS);
  EXPECT_EQ(out, std::vector<uint16_t>(kSize / 2, half));

  // Reset: empty and open again; a list runs as often as it is executed.
  ASSERT_EQ(ze->zeCommandListReset(regular), ZE_RESULT_SUCCESS);
  const std::vector<uint8_t> src = Pattern(kSize, 9);
  ASSERT_EQ(ze->zeCommandListAppendMemoryCopy(regular, mem, src.data(), kSize, nullptr, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeCommandListClose(regular), ZE_RESULT_SUCCESS);
  ze_command_list_handle_t twice[] = {regular, regular};
  ASSERT_EQ(ze->zeCommandQueueExecuteCommandLists(queue, 2, twice, nullptr), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeCommandQueueSynchronize(queue, kWaitNs), ZE_RESULT_SUCCESS);
  std::vector<uint8_t> back(kSize);
  ASSERT_EQ(CopyAndWait(back.data(), mem, kSize), ZE_RESULT_SUCCESS);
  EXPECT_EQ(back, src);

  EXPECT_EQ(ze->zeCommandQueueDestroy(queue), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeCommandListDestroy(regular), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventDestroy(gate), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventPoolDestroy(events), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeMemFree(context, mem), ZE_RESULT_SUCCESS);
}

TEST_F(FakeZeTest, EventPoolRules) {
  ze_event_pool_handle_t local = NewPool(context, ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 2);
  ze_ipc_event_pool_handle_t handle{};
  EXPECT_EQ(ze->zeEventPoolGetIpcHandle(local, &handle), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
  ze_event_pool_handle_t shared =
      NewPool(context, ZE_EVENT_POOL_FLAG_HOST_VISIBLE | ZE_EVENT_POOL_FLAG_IPC, 2);
  ASSERT_EQ(ze->zeEventPoolGetIpcHandle(shared, &handle), ZE_RESULT_SUCCESS);
  EXPECT_EQ(std::string(handle.data + 12, 4), "FZEP");
  EXPECT_EQ(LoadU64(handle.data + 8) & 0xffffffffu, 2u);
  EXPECT_EQ(FdTarget(static_cast<int>(LoadU64(handle.data))).rfind("/memfd:", 0), 0u);

  auto desc = Zeroed<ze_event_desc_t>(ZE_STRUCTURE_TYPE_EVENT_DESC);
  desc.index = 2;
  ze_event_handle_t event = nullptr;
  EXPECT_EQ(ze->zeEventCreate(shared, &desc, &event), ZE_RESULT_ERROR_INVALID_ARGUMENT) << "index";
  ze_event_handle_t first = NewEvent(shared, 1);
  desc.index = 1;
  EXPECT_EQ(ze->zeEventCreate(shared, &desc, &event), ZE_RESULT_ERROR_INVALID_ARGUMENT) << "in use";
  EXPECT_EQ(ze->zeEventPoolDestroy(shared), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
  EXPECT_EQ(ze->zeEventPoolCloseIpcHandle(shared), ZE_RESULT_ERROR_INVALID_ARGUMENT);

  // Opened (here, in the same process and another context), the pool's events are the same
  // words of memory.
  ze_context_handle_t other = NewContext();
  ze_event_pool_handle_t opened = nullptr;
  ASSERT_EQ(ze->zeEventPoolOpenIpcHandle(other, handle, &opened), ZE_RESULT_SUCCESS);
  EXPECT_EQ(Added("event_pool_open"), 1);
  ze_event_handle_t mirror = NewEvent(opened, 1);
  EXPECT_EQ(ze->zeEventQueryStatus(mirror), ZE_RESULT_NOT_READY);
  ASSERT_EQ(ze->zeEventHostSignal(first), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventHostSynchronize(mirror, kWaitNs), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeEventHostReset(mirror), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventQueryStatus(first), ZE_RESULT_NOT_READY);
  EXPECT_EQ(ze->zeEventPoolDestroy(opened), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ze->zeEventPoolCloseIpcHandle(opened), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);

  ze_ipc_event_pool_handle_t bad = handle;
  bad.data[12] = 'X';
  ze_event_pool_handle_t never = nullptr;
  EXPECT_EQ(ze->zeEventPoolOpenIpcHandle(other, bad, &never), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  bad = handle;
  StoreU32(bad.data + 8, 1u << 20);  // more events than the memfd holds
  EXPECT_EQ(ze->zeEventPoolOpenIpcHandle(other, bad, &never), ZE_RESULT_ERROR_INVALID_ARGUMENT);

  EXPECT_EQ(ze->zeEventDestroy(mirror), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventPoolCloseIpcHandle(opened), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventDestroy(first), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventPoolDestroy(shared), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventPoolDestroy(local), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeContextDestroy(other), ZE_RESULT_SUCCESS);
}

TEST_F(FakeZeTest, IpcEventsOrderWorkAcrossProcesses) {
  ze_event_pool_handle_t shared =
      NewPool(context, ZE_EVENT_POOL_FLAG_HOST_VISIBLE | ZE_EVENT_POOL_FLAG_IPC, 4);
  ze_event_handle_t events[4];
  for (uint32_t i = 0; i < 4; ++i) events[i] = NewEvent(shared, i);
  ASSERT_EQ(ze->zeEventHostSignal(events[3]), ZE_RESULT_SUCCESS);  // before the helper opens
  ze_ipc_event_pool_handle_t handle{};
  ASSERT_EQ(ze->zeEventPoolGetIpcHandle(shared, &handle), ZE_RESULT_SUCCESS);

  Helper helper = Spawn("events", {});
  ASSERT_GT(helper.pid, 0);
  ASSERT_TRUE(tensord::common::testing::SendWithFd(helper.sock.get(), std::string(handle.data, sizeof(handle.data)),
                      static_cast<int>(LoadU64(handle.data))));
  std::string armed;
  ASSERT_TRUE(RecvMsg(helper.sock.get(), &armed));
  ASSERT_EQ(armed, "armed\n");
  // The helper's list waits on event 0: its signal of event 1 must not have run.
  std::this_thread::sleep_for(kStallCheck);
  EXPECT_EQ(ze->zeEventQueryStatus(events[1]), ZE_RESULT_NOT_READY);

  // This process's list waits on the helper's event 1 before its copy...
  const std::vector<uint8_t> src = Pattern(1024, 4);
  std::vector<uint8_t> dst(1024, 0);
  ASSERT_EQ(ze->zeEventHostReset(done), ZE_RESULT_SUCCESS);
  ze_command_list_handle_t waiter = NewImmediateList(context);
  ASSERT_EQ(ze->zeCommandListAppendWaitOnEvents(waiter, 1, &events[1]), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeCommandListAppendMemoryCopy(waiter, dst.data(), src.data(), src.size(), done, 0,
                                              nullptr),
            ZE_RESULT_SUCCESS);
  std::this_thread::sleep_for(kStallCheck);
  EXPECT_EQ(ze->zeEventQueryStatus(done), ZE_RESULT_NOT_READY);
  // ...and signals event 0 from a command list, which releases the helper's list.
  ASSERT_EQ(ze->zeCommandListAppendSignalEvent(list, events[0]), ZE_RESULT_SUCCESS);
  ASSERT_EQ(ze->zeEventHostSynchronize(done, kWaitNs), ZE_RESULT_SUCCESS);
  EXPECT_EQ(dst, src);
  EXPECT_EQ(ze->zeEventHostSynchronize(events[2], kWaitNs), ZE_RESULT_SUCCESS)
      << "the helper's host signal";

  std::string text;
  ASSERT_TRUE(RecvMsg(helper.sock.get(), &text));
  EXPECT_EQ(helper.Wait(), 0) << text;
  auto report = ParseReport(text);
  EXPECT_EQ(report["event_pool_open"], "1");
  EXPECT_EQ(report["ev0_at_open"], Str(ZE_RESULT_NOT_READY));
  EXPECT_EQ(report["ev3_at_open"], Str(ZE_RESULT_SUCCESS)) << "opening must not reset";
  EXPECT_EQ(report["ev1_signalled"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["ev0_seen"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["close_in_use"], Str(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE));
  EXPECT_EQ(report["destroy_opened"], Str(ZE_RESULT_ERROR_INVALID_ARGUMENT));
  EXPECT_EQ(report["close"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["event_pool_open_after"], "0");
  EXPECT_EQ(report["context_destroy"], Str(ZE_RESULT_SUCCESS));

  EXPECT_EQ(ze->zeCommandListDestroy(waiter), ZE_RESULT_SUCCESS);
  for (ze_event_handle_t e : events) EXPECT_EQ(ze->zeEventDestroy(e), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventPoolDestroy(shared), ZE_RESULT_SUCCESS);
}

TEST_F(FakeZeTest, FaultInjectionFailsTheNextCallOnly) {
  auto desc = Zeroed<ze_device_mem_alloc_desc_t>(ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC);
  void* mem = nullptr;
  ASSERT_TRUE(FailNext("zeMemAllocDevice", ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY));
  EXPECT_EQ(ze->zeMemAllocDevice(context, &desc, 4096, 0, device, &mem),
            ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
  EXPECT_EQ(Added("allocation"), 0);
  ASSERT_EQ(ze->zeMemAllocDevice(context, &desc, 4096, 0, device, &mem), ZE_RESULT_SUCCESS);

  ze_ipc_mem_handle_t handle{};
  ASSERT_TRUE(FailNext("zeMemGetIpcHandle", ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY));
  EXPECT_EQ(ze->zeMemGetIpcHandle(context, mem, &handle), ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
  ASSERT_EQ(ze->zeMemGetIpcHandle(context, mem, &handle), ZE_RESULT_SUCCESS);

  void* opened = nullptr;
  ASSERT_TRUE(FailNext("zeMemOpenIpcHandle", ZE_RESULT_ERROR_INVALID_ARGUMENT));
  EXPECT_EQ(ze->zeMemOpenIpcHandle(context, device, handle, 0, &opened),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(Added("ipc_open"), 0);
  ASSERT_EQ(ze->zeMemOpenIpcHandle(context, device, handle, 0, &opened), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeMemCloseIpcHandle(context, opened), ZE_RESULT_SUCCESS);

  ze_event_pool_desc_t pool_desc{ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, nullptr, 0, 1};
  ze_event_pool_handle_t p = nullptr;
  ASSERT_TRUE(FailNext("zeEventPoolCreate", ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY));
  EXPECT_EQ(ze->zeEventPoolCreate(context, &pool_desc, 0, nullptr, &p),
            ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
  EXPECT_EQ(Added("event_pool"), 1) << "the fixture's only";
  ASSERT_EQ(ze->zeEventPoolCreate(context, &pool_desc, 0, nullptr, &p), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeEventPoolDestroy(p), ZE_RESULT_SUCCESS);

  auto context_desc = Zeroed<ze_context_desc_t>(ZE_STRUCTURE_TYPE_CONTEXT_DESC);
  ze_context_handle_t c = nullptr;
  ASSERT_TRUE(FailNext("zeContextCreate", ZE_RESULT_ERROR_DEVICE_LOST));
  EXPECT_EQ(ze->zeContextCreate(driver, &context_desc, &c), ZE_RESULT_ERROR_DEVICE_LOST);
  EXPECT_EQ(Added("context"), 1);
  ASSERT_EQ(ze->zeContextCreate(driver, &context_desc, &c), ZE_RESULT_SUCCESS);
  EXPECT_EQ(ze->zeContextDestroy(c), ZE_RESULT_SUCCESS);

  // SUCCESS cancels a pending failure; unknown kinds are -1.
  ASSERT_TRUE(FailNext("zeMemFree", ZE_RESULT_ERROR_UNKNOWN));
  ASSERT_TRUE(FailNext("zeMemFree", ZE_RESULT_SUCCESS));
  EXPECT_EQ(ze->zeMemFree(context, mem), ZE_RESULT_SUCCESS);
  EXPECT_EQ(Live("no such kind"), -1);
}

// ---- The unavailable paths, and what another process sees -------------------------------

TEST(FakeZeEnvironment, NoDevicesStillInitialises) {
  int code = -1;
  auto report = Probe({"TENSORD_FAKE_ZE_DEVICES=0"}, &code);
  EXPECT_EQ(code, 0) << report["fatal"];
  EXPECT_EQ(report["init"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["drivers"], "1");
  EXPECT_EQ(report["devices"], "0");
  EXPECT_EQ(report["context_destroy"], Str(ZE_RESULT_SUCCESS));
}

TEST(FakeZeEnvironment, FailInitFailsZeInitThroughTheLoader) {
  int code = -1;
  auto report = Probe({"TENSORD_FAKE_ZE_FAIL_INIT=1"}, &code);
  EXPECT_EQ(code, 0) << report["fatal"];
  EXPECT_EQ(report["init"], Str(ZE_RESULT_ERROR_UNINITIALIZED));
  EXPECT_NE(report["driver_get"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report.count("devices"), 0u);
}

TEST(FakeZeEnvironment, AMalformedKnobFailsZeInit) {
  int code = -1;
  auto report = Probe({"TENSORD_FAKE_ZE_DEVICES=two"}, &code);
  EXPECT_EQ(code, 0) << report["fatal"];
  EXPECT_EQ(report["init"], Str(ZE_RESULT_ERROR_UNINITIALIZED));
}

TEST(FakeZeEnvironment, DevicesHaveStableDistinctUuidsAndTheirOwnMemory) {
  const Ze* ze = LoadZe();
  ASSERT_NE(ze, nullptr);
  ASSERT_EQ(ze->zeInit(0), ZE_RESULT_SUCCESS);
  ze_driver_handle_t driver = nullptr;
  uint32_t n = 1;
  ASSERT_EQ(ze->zeDriverGet(&n, &driver), ZE_RESULT_SUCCESS);
  ze_device_handle_t device = nullptr;
  ASSERT_EQ(ze->zeDeviceGet(driver, &n, &device), ZE_RESULT_SUCCESS);
  auto props = Zeroed<ze_device_properties_t>(ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES);
  ASSERT_EQ(ze->zeDeviceGetProperties(device, &props), ZE_RESULT_SUCCESS);

  int code = -1;
  auto report =
      Probe({"TENSORD_FAKE_ZE_DEVICES=3", "TENSORD_FAKE_ZE_DEVICE_MEMORY=1048576"}, &code);
  EXPECT_EQ(code, 0) << report["fatal"];
  EXPECT_EQ(report["init"], Str(ZE_RESULT_SUCCESS));
  ASSERT_EQ(report["devices"], "3");
  // Identical in every process: the way a process maps another's device to its own.
  EXPECT_EQ(report["uuid0"], Hex(props.uuid.id, sizeof(props.uuid.id)));
  EXPECT_NE(report["uuid1"], report["uuid0"]);
  EXPECT_NE(report["uuid2"], report["uuid1"]);
  EXPECT_EQ(report["uuid2"].substr(0, 28), report["uuid0"].substr(0, 28)) << "same prefix";
  EXPECT_EQ(report["name2"], "tensord fake Level Zero device 2");
  EXPECT_EQ(report["memory1"], "1048576");
  EXPECT_EQ(report["alloc_oversize"], Str(ZE_RESULT_ERROR_UNSUPPORTED_SIZE));
  EXPECT_EQ(report["alloc_three_quarters"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["alloc_half_more"], Str(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY));
  EXPECT_EQ(report["alloc_half_other_device"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["open_on_other_device"], Str(ZE_RESULT_ERROR_INVALID_ARGUMENT));
  EXPECT_EQ(report["open_on_own_device"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["alloc_half_after_free"], Str(ZE_RESULT_SUCCESS));
  EXPECT_EQ(report["context_destroy"], Str(ZE_RESULT_SUCCESS));
}

}  // namespace
