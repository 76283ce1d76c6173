#include "common/memory/cuda/cuda_driver.h"

#include <stdlib.h>

#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/fake_cuda_env.h"

namespace tensord::common {
namespace {

using ::testing::HasSubstr;
using testing::FakePrimaryContextRetains;
using testing::FakeUuid;

// The driver loads once per process, so each environment is tried in a fresh child:
// death tests in "threadsafe" style re-execute this binary for the statement.
class CudaDriverLoadTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Loads the driver and exits 0 when available, 1 when not, printing the reason.
[[noreturn]] void LoadAndReport() {
  const CudaDriver& driver = CudaDriver::Get();
  std::fprintf(stderr, "reason=[%s]\n", driver.unavailable_reason().c_str());
  bool table_clear = driver.cuInit == nullptr && driver.cuMemCreate == nullptr;
  if (!driver.available() && !table_clear) std::_Exit(2);  // a half-loaded table
  std::_Exit(driver.available() ? 0 : 1);
}

TEST_F(CudaDriverLoadTest, MissingLibraryNamesTheDlopenError) {
  EXPECT_EXIT(
      {
        ::setenv("TENSORD_LIBCUDA", "/nonexistent/libcuda-missing.so.1", 1);
        LoadAndReport();
      },
      ::testing::ExitedWithCode(1),
      "reason=\\[/nonexistent/libcuda-missing.so.1 not found \\(dlopen: .*No such file or directory\\): "
      "no NVIDIA driver on this machine\\]");
}

TEST_F(CudaDriverLoadTest, NoDeviceIsUnavailableWithTheDriversWords) {
  EXPECT_EXIT(
      {
        ::setenv("TENSORD_FAKE_CUDA_DEVICES", "0", 1);
        LoadAndReport();
      },
      ::testing::ExitedWithCode(1),
      "reason=\\[no CUDA device: cuInit: CUDA_ERROR_NO_DEVICE \\(no CUDA-capable device is detected\\) "
      "\\(CUDA_VISIBLE_DEVICES unset\\)\\]");
}

TEST_F(CudaDriverLoadTest, EmptyVisibleDevicesHidesEveryDevice) {
  EXPECT_EXIT(
      {
        ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
        LoadAndReport();
      },
      ::testing::ExitedWithCode(1), "reason=\\[no CUDA device: cuInit: CUDA_ERROR_NO_DEVICE .*\\(CUDA_VISIBLE_DEVICES=\\)\\]");
}

TEST_F(CudaDriverLoadTest, MissingSymbolIsNamed) {
  EXPECT_EXIT(
      {
        ::setenv("TENSORD_LIBCUDA", TENSORD_FAKE_CUDA_INCOMPLETE_PATH, 1);
        LoadAndReport();
      },
      ::testing::ExitedWithCode(1), "reason=\\[.*libtensord_fake_cuda_incomplete.so lacks cuGetErrorName \\(dlsym: .*\\)");
}

TEST_F(CudaDriverLoadTest, FakeWithDevicesLoads) {
  EXPECT_EXIT(LoadAndReport(), ::testing::ExitedWithCode(0), "reason=\\[\\]");
}

TEST_F(CudaDriverLoadTest, UnavailableDriverAnswersUnavailable) {
  EXPECT_EXIT(
      {
        ::setenv("TENSORD_FAKE_CUDA_DEVICES", "0", 1);
        const CudaDriver& driver = CudaDriver::Get();
        auto device = driver.DeviceByUuid(FakeUuid(0));
        auto context = driver.PrimaryContext(0);
        bool ok = device.status().code() == absl::StatusCode::kUnavailable &&
                  context.status().code() == absl::StatusCode::kUnavailable;
        std::fprintf(stderr, "%s\n", std::string(device.status().message()).c_str());
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "cuda: no CUDA device");
}

TEST_F(CudaDriverLoadTest, VisibleDevicesByUuidRenumberOrdinals) {
  EXPECT_EXIT(
      {
        ::setenv("CUDA_VISIBLE_DEVICES", testing::FakeUuidText(1).c_str(), 1);
        const CudaDriver& driver = CudaDriver::Get();
        auto device = driver.DeviceByUuid(FakeUuid(1));
        auto hidden = driver.DeviceByUuid(FakeUuid(0));
        std::fprintf(stderr, "hidden=[%s]\n", std::string(hidden.status().message()).c_str());
        std::_Exit(device.ok() && *device == 0 && !hidden.ok() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "hidden=\\[device GPU-8a3f1c5e-2241-4b7d-9c0e-6f1355a20000 is not visible in this process "
      "\\(CUDA_VISIBLE_DEVICES=GPU-8a3f1c5e-2241-4b7d-9c0e-6f1355a20001\\)\\]");
}

TEST(CudaDriverTest, LoadsOnce) {
  const CudaDriver& a = CudaDriver::Get();
  const CudaDriver& b = CudaDriver::Get();
  EXPECT_EQ(&a, &b);
  ASSERT_TRUE(a.available()) << a.unavailable_reason();
  EXPECT_EQ(a.library(), TENSORD_FAKE_CUDA_PATH);
}

TEST(CudaDriverTest, ErrorTextUsesTheDriversNames) {
  const CudaDriver& driver = CudaDriver::Get();
  EXPECT_EQ(driver.ErrorText(CUDA_ERROR_OUT_OF_MEMORY), "CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  EXPECT_EQ(driver.ErrorText(static_cast<CUresult>(12345)), "CUresult 12345");
}

TEST(CudaDriverTest, CudaStatusMapsCodes) {
  const CudaDriver& driver = CudaDriver::Get();
  EXPECT_TRUE(driver.CudaStatus(CUDA_SUCCESS, "x").ok());
  absl::Status oom = driver.CudaStatus(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate of 2 MiB on cuda:0");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(oom.message(), "cuMemCreate of 2 MiB on cuda:0: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  EXPECT_EQ(driver.CudaStatus(CUDA_ERROR_INVALID_VALUE, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(driver.CudaStatus(CUDA_ERROR_INVALID_DEVICE, "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(driver.CudaStatus(CUDA_ERROR_ALREADY_MAPPED, "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(driver.CudaStatus(CUDA_ERROR_NOT_PERMITTED, "x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(driver.CudaStatus(CUDA_ERROR_NOT_SUPPORTED, "x").code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(driver.CudaStatus(CUDA_ERROR_DEINITIALIZED, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(driver.CudaStatus(CUDA_ERROR_ILLEGAL_ADDRESS, "x").code(), absl::StatusCode::kInternal);
}

TEST(CudaDriverTest, DeviceByUuidFindsTheOrdinal) {
  const CudaDriver& driver = CudaDriver::Get();
  auto one = driver.DeviceByUuid(FakeUuid(1));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, 1);
  auto uuid = driver.DeviceUuid(1);
  ASSERT_TRUE(uuid.ok()) << uuid.status();
  EXPECT_EQ(*uuid, FakeUuid(1));
  auto absent = driver.DeviceByUuid(FakeUuid(7));
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(absent.status().message(),
            "device GPU-8a3f1c5e-2241-4b7d-9c0e-6f1355a20007 is not visible in this process "
            "(CUDA_VISIBLE_DEVICES unset)");
  EXPECT_EQ(driver.DeviceByUuid("short").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaDriverTest, FormatGpuUuidLikeNvidiaSmi) {
  EXPECT_EQ(FormatGpuUuid(std::string("\x00\x11\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\xcc\xdd\xee\xff", 16)),
            "GPU-00112233-4455-6677-8899-aabbccddeeff");
  EXPECT_EQ(FormatGpuUuid("abc"), "GPU-<invalid uuid>");
}

TEST(CudaDriverTest, ScopedContextRetainsThePrimaryContextOnceAndPops) {
  const CudaDriver& driver = CudaDriver::Get();
  const int before = FakePrimaryContextRetains(1);
  uint32_t word = 0;
  // No context is current: a copy needs one.
  EXPECT_EQ(driver.cuMemcpyDtoH_v2(&word, 0, sizeof(word)), CUDA_ERROR_INVALID_CONTEXT);
  {
    auto outer = ScopedCudaContext::Push(driver, 1);
    ASSERT_TRUE(outer.ok()) << outer.status();
    auto inner = ScopedCudaContext::Push(driver, 1);
    ASSERT_TRUE(inner.ok()) << inner.status();
    EXPECT_EQ(FakePrimaryContextRetains(1), before == 0 ? 1 : before);
    // A context is current: the copy now fails on the address, not the context.
    EXPECT_EQ(driver.cuMemcpyDtoH_v2(&word, 0, sizeof(word)), CUDA_ERROR_INVALID_VALUE);
  }
  EXPECT_EQ(driver.cuMemcpyDtoH_v2(&word, 0, sizeof(word)), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_FALSE(ScopedCudaContext::Push(driver, 9).ok());
}

}  // namespace
}  // namespace tensord::common
