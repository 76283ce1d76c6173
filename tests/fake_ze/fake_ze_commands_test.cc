// The fake's command lists through the real loader: a wait on an unsignalled event stalls the
// commands after it, resets and barriers run in order, and regular lists run when a command
// queue executes them.
#include <gtest/gtest.h>
#include <level_zero/ze_api.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "tests/fake_ze/fake_ze_fixture.h"
#include "tests/fake_ze/fake_ze_loader_api.h"

namespace tensord::fake_ze_test {
namespace {

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

}  // namespace
}  // namespace tensord::fake_ze_test
