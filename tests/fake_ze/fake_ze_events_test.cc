// The fake's event pools through the real loader: the rules of local and IPC pools, and IPC
// events that order work across processes (a helper opens the pool's handle).
#include <gtest/gtest.h>
#include <level_zero/ze_api.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tests/fake_ze/fake_ze_fixture.h"
#include "tests/fake_ze/fake_ze_helper_process.h"
#include "tests/fake_ze/fake_ze_loader_api.h"
#include "tests/fd_passing.h"

namespace tensord::fake_ze_test {
namespace {

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

}  // namespace
}  // namespace tensord::fake_ze_test
