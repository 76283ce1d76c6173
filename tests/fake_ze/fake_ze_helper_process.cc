// The fake_ze tests' helper processes (fake_ze_helper_process.h): the environment the
// test and every helper run with, each role a helper plays, and how the test spawns one.
#include "tests/fake_ze/fake_ze_helper_process.h"

#include <fcntl.h>
#include <level_zero/ze_api.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tests/fd_passing.h"

extern char** environ;

namespace tensord::fake_ze_test {
namespace {

constexpr char kRoleEnv[] = "TENSORD_FAKE_ZE_TEST_ROLE";
constexpr char kSockEnv[] = "TENSORD_FAKE_ZE_TEST_SOCK";

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

}  // namespace

// ---- The parent's side of a helper --------------------------------------------------------

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

std::map<std::string, std::string> Probe(const std::vector<std::string>& env, int* exit_code) {
  Helper helper = Spawn("probe", env);
  std::string text;
  const bool got = helper.pid > 0 && RecvMsg(helper.sock.get(), &text);
  *exit_code = helper.Wait();
  return got ? ParseReport(text) : std::map<std::string, std::string>{};
}

}  // namespace tensord::fake_ze_test
