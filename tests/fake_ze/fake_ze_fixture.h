// FakeZeTest: the real loader with the fake as its only driver, and per test a context, an
// event pool with one host-visible event and an immediate command list on device 0, with
// helpers that make more. Live objects are counted before each test and must be back to
// those counts after it: every test leaves nothing behind.
#pragma once

#include <gtest/gtest.h>
#include <level_zero/ze_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "tests/fake_ze/fake_ze_loader_api.h"

namespace tensord::fake_ze_test {

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

}  // namespace tensord::fake_ze_test
