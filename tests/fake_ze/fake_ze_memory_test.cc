// The fake's device memory through the real loader: writes and reads through command lists,
// allocation properties, ranges and limits, and memory IPC handles opened in another process
// (the fd passed over a socketpair with SCM_RIGHTS) and in another context.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <level_zero/ze_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/fake_ze/fake_ze_fixture.h"
#include "tests/fake_ze/fake_ze_helper_process.h"
#include "tests/fake_ze/fake_ze_loader_api.h"
#include "tests/fd_passing.h"

namespace tensord::fake_ze_test {
namespace {

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

}  // namespace
}  // namespace tensord::fake_ze_test
