// What a Level Zero program of the level-zero-fake tests does with its own device: the
// loader's API resolved from libze_loader.so.1 (the same library, and so the same driver
// and handles, as tensord's ZeLoader in this process), a context of its own handed to
// tensord (UseLevelZeroContext), and an immediate command list on one device. The tests
// run it against tests/fake_ze through the real loader (ZE_ENABLE_ALT_DRIVERS).
#pragma once

#include <dlfcn.h>
#include <level_zero/ze_api.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace tensord::testing {

class ZeProgram {
 public:
  // Initialises the loader and takes device `ordinal` (in the loader's order, as tensord
  // numbers them); ok() says whether every step worked, error() which did not.
  explicit ZeProgram(int ordinal) {
    void* loader = ::dlopen("libze_loader.so.1", RTLD_NOW | RTLD_LOCAL);
    if (loader == nullptr) {
      error_ = "dlopen libze_loader.so.1";
      return;
    }
#define TENSORD_ZE_TEST_RESOLVE(name) name = reinterpret_cast<decltype(&::name)>(::dlsym(loader, #name));
    TENSORD_ZE_TEST_RESOLVE(zeInit)
    TENSORD_ZE_TEST_RESOLVE(zeDriverGet)
    TENSORD_ZE_TEST_RESOLVE(zeDeviceGet)
    TENSORD_ZE_TEST_RESOLVE(zeContextCreate)
    TENSORD_ZE_TEST_RESOLVE(zeCommandListCreateImmediate)
    TENSORD_ZE_TEST_RESOLVE(zeCommandListAppendMemoryCopy)
    TENSORD_ZE_TEST_RESOLVE(zeCommandListAppendWaitOnEvents)
    TENSORD_ZE_TEST_RESOLVE(zeCommandListAppendSignalEvent)
    TENSORD_ZE_TEST_RESOLVE(zeEventPoolCreate)
    TENSORD_ZE_TEST_RESOLVE(zeEventCreate)
    TENSORD_ZE_TEST_RESOLVE(zeEventHostSignal)
    TENSORD_ZE_TEST_RESOLVE(zeEventHostSynchronize)
    TENSORD_ZE_TEST_RESOLVE(zeEventQueryStatus)
    TENSORD_ZE_TEST_RESOLVE(zeMemAllocDevice)
    TENSORD_ZE_TEST_RESOLVE(zeMemFree)
#undef TENSORD_ZE_TEST_RESOLVE
    if (zeInit == nullptr || zeMemFree == nullptr || zeInit(ZE_INIT_FLAG_GPU_ONLY) != ZE_RESULT_SUCCESS) {
      error_ = "zeInit";
      return;
    }
    uint32_t count = 1;
    if (zeDriverGet(&count, &driver_) != ZE_RESULT_SUCCESS || count == 0) {
      error_ = "zeDriverGet";
      return;
    }
    uint32_t devices = 0;
    if (zeDeviceGet(driver_, &devices, nullptr) != ZE_RESULT_SUCCESS || ordinal >= static_cast<int>(devices)) {
      error_ = "zeDeviceGet";
      return;
    }
    std::vector<ze_device_handle_t> all(devices);
    (void)zeDeviceGet(driver_, &devices, all.data());
    device_ = all[static_cast<size_t>(ordinal)];
    ze_context_desc_t context_desc{};
    context_desc.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC;
    ze_command_queue_desc_t list_desc{};
    list_desc.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
    ze_event_pool_desc_t pool_desc{};
    pool_desc.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC;
    pool_desc.flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE;
    pool_desc.count = kEvents;
    if (zeContextCreate(driver_, &context_desc, &context_) != ZE_RESULT_SUCCESS ||
        zeCommandListCreateImmediate(context_, device_, &list_desc, &list_) != ZE_RESULT_SUCCESS ||
        zeEventPoolCreate(context_, &pool_desc, 0, nullptr, &pool_) != ZE_RESULT_SUCCESS) {
      error_ = "context, command list or event pool";
      return;
    }
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  void* driver() const { return driver_; }
  void* context() const { return context_; }
  ze_device_handle_t device() const { return device_; }
  ze_command_list_handle_t list() const { return list_; }
  uintptr_t stream() const { return reinterpret_cast<uintptr_t>(list_); }

  // A new unsignalled event of this program's (host-visible) pool; null when out.
  ze_event_handle_t NewEvent() {
    if (next_event_ >= kEvents) return nullptr;
    ze_event_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_EVENT_DESC;
    desc.index = next_event_++;
    desc.signal = ZE_EVENT_SCOPE_FLAG_HOST;
    desc.wait = ZE_EVENT_SCOPE_FLAG_HOST;
    ze_event_handle_t event = nullptr;
    return zeEventCreate(pool_, &desc, &event) == ZE_RESULT_SUCCESS ? event : nullptr;
  }
  // Stalls the list until `gate` is signalled from the host: its later work "has not run".
  bool Stall(ze_event_handle_t gate) { return zeCommandListAppendWaitOnEvents(list_, 1, &gate) == ZE_RESULT_SUCCESS; }
  // Queues a copy on the list (signalling `done` after it, if given).
  bool Copy(void* dst, const void* src, size_t bytes, ze_event_handle_t done = nullptr) {
    return zeCommandListAppendMemoryCopy(list_, dst, src, bytes, done, 0, nullptr) == ZE_RESULT_SUCCESS;
  }
  // A copy that has finished when this returns.
  bool CopyNow(void* dst, const void* src, size_t bytes) {
    ze_event_handle_t done = NewEvent();
    return done != nullptr && Copy(dst, src, bytes, done) && zeEventHostSynchronize(done, UINT64_MAX) == ZE_RESULT_SUCCESS;
  }

#define TENSORD_ZE_TEST_MEMBER(name) decltype(&::name) name = nullptr;
  TENSORD_ZE_TEST_MEMBER(zeInit)
  TENSORD_ZE_TEST_MEMBER(zeDriverGet)
  TENSORD_ZE_TEST_MEMBER(zeDeviceGet)
  TENSORD_ZE_TEST_MEMBER(zeContextCreate)
  TENSORD_ZE_TEST_MEMBER(zeCommandListCreateImmediate)
  TENSORD_ZE_TEST_MEMBER(zeCommandListAppendMemoryCopy)
  TENSORD_ZE_TEST_MEMBER(zeCommandListAppendWaitOnEvents)
  TENSORD_ZE_TEST_MEMBER(zeCommandListAppendSignalEvent)
  TENSORD_ZE_TEST_MEMBER(zeEventPoolCreate)
  TENSORD_ZE_TEST_MEMBER(zeEventCreate)
  TENSORD_ZE_TEST_MEMBER(zeEventHostSignal)
  TENSORD_ZE_TEST_MEMBER(zeEventHostSynchronize)
  TENSORD_ZE_TEST_MEMBER(zeEventQueryStatus)
  TENSORD_ZE_TEST_MEMBER(zeMemAllocDevice)
  TENSORD_ZE_TEST_MEMBER(zeMemFree)
#undef TENSORD_ZE_TEST_MEMBER

 private:
  static constexpr uint32_t kEvents = 64;
  std::string error_;
  ze_driver_handle_t driver_ = nullptr;
  ze_device_handle_t device_ = nullptr;
  ze_context_handle_t context_ = nullptr;
  ze_command_list_handle_t list_ = nullptr;
  ze_event_pool_handle_t pool_ = nullptr;
  uint32_t next_event_ = 0;
};

// The fake driver's test query (tests/fake_ze/README.md): live objects of `kind` in this
// process; -1 when the fake is not what the loader loaded.
inline int64_t FakeZeLiveObjects(const char* kind) {
  const char* path = std::getenv("ZE_ENABLE_ALT_DRIVERS");
  void* fake = path == nullptr ? nullptr : ::dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  using Live = int64_t (*)(const char*);
  auto live = fake == nullptr ? nullptr : reinterpret_cast<Live>(::dlsym(fake, "tensord_fake_ze_live_objects"));
  return live == nullptr ? -1 : live(kind);
}

}  // namespace tensord::testing
