// libtensord_fake_ze.so's driver and devices through Debian's real Level Zero loader
// (libze_loader.so.1, dlopened as tensord's level_zero backend does, never linked): what zeInit
// and enumeration find, the tables the loader passes through, fault injection, and the "no
// usable driver" paths and several devices, seen from helper processes.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <level_zero/ze_api.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "tests/fake_ze/fake_ze_fixture.h"
#include "tests/fake_ze/fake_ze_helper_process.h"
#include "tests/fake_ze/fake_ze_loader_api.h"

namespace tensord::fake_ze_test {
namespace {

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
}  // namespace tensord::fake_ze_test
