// CudaHostImporter (pinned host views) against libtensord_fake_cuda.so: the registration's
// lifetime, flags and errors. The fake records registrations; nothing is page-locked.
#include "common/memory/cuda/cuda_host_importer.h"

#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "common/memory/cuda/cuda_backend.h"
#include "common/memory/host/host_importer.h"
#include "common/memory/host/mapped_region.h"
#include "common/memory/host/memfd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/fake_cuda_env.h"

namespace tensord::common {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::FakeFailNext;
using testing::FakeLiveObjects;

constexpr uint64_t kSize = 3 * 4096;

// A sealed memfd as the broker hands it out, with `seed` in its first bytes.
FetchedBuffer HostBuffer(uint8_t seed) {
  auto fd = CreateSealedMemfd("cuda-host-importer-test", kSize);
  EXPECT_TRUE(fd.ok()) << fd.status();
  auto w = MappedRegion::Map(fd->get(), kSize, MapMode::kSharedWritable, "fill");
  EXPECT_TRUE(w.ok()) << w.status();
  for (uint64_t i = 0; i < kSize; ++i) w->data()[i] = static_cast<uint8_t>(seed + i);
  FetchedBuffer buffer;
  buffer.buffer_id = 11;
  buffer.size = kSize;
  buffer.device_type = tensord::v1::DEVICE_TYPE_CPU;
  buffer.handle.fds.push_back(*std::move(fd));
  return buffer;
}

// The permissions /proc/self/maps shows for the mapping at `p` ("r--s"), or "".
std::string MapsPermissions(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo <= at && at < hi) return perms;
  }
  return "";
}

class CudaHostImporterTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(driver_.available()) << driver_.unavailable_reason(); }
  const CudaDriver& driver_ = CudaDriver::Get();
  CudaHostImporter importer_{std::make_unique<HostImporter>(), &driver_};
};

TEST_F(CudaHostImporterTest, RegistersTheWholeSharedReadOnlyMappingAndUnregistersItWithTheRegion) {
  ASSERT_EQ(FakeLiveObjects("host_register"), 0);
  void* data = nullptr;
  {
    auto region = importer_.Import(HostBuffer(5), MapMode::kSharedReadOnly, "buffer 11");
    ASSERT_TRUE(region.ok()) << region.status();
    const ImportedRegion& r = **region;
    data = r.data();
    EXPECT_EQ(r.size(), kSize);
    EXPECT_EQ(r.mode(), MapMode::kSharedReadOnly);
    EXPECT_EQ(r.view_device_type(), tensord::v1::DEVICE_TYPE_CUDA_HOST);
    EXPECT_EQ(r.device_ordinal(), 0);
    EXPECT_EQ(r.data()[0], 5);
    EXPECT_EQ(r.data()[kSize - 1], static_cast<uint8_t>(5 + kSize - 1));
    // The read-only choice: a shared mapping the CPU cannot write, never copy-on-write.
    EXPECT_EQ(MapsPermissions(r.data()), "r--s");
    EXPECT_EQ(FakeLiveObjects("host_register"), 1);

    // It is the whole mapping that is registered: any part of it is taken, from any context.
    auto context = ScopedCudaContext::Push(driver_, 1);
    ASSERT_TRUE(context.ok()) << context.status();
    EXPECT_EQ(driver_.cuMemHostRegister_v2(r.data() + kSize - 4096, 4096, CU_MEMHOSTREGISTER_READ_ONLY),
              CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  }
  // Unregistered before the munmap: the fake refuses to unregister an unmapped range, and
  // such a refusal would leave the registration counted.
  EXPECT_EQ(FakeLiveObjects("host_register"), 0);
  EXPECT_EQ(MapsPermissions(data), "");
}

TEST_F(CudaHostImporterTest, EachRegionRegistersItsOwnMappingOnce) {
  FetchedBuffer buffer = HostBuffer(9);
  auto a = importer_.Import(buffer, MapMode::kSharedReadOnly, "buffer 11");
  auto b = importer_.Import(buffer, MapMode::kSharedReadOnly, "buffer 11");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE((*a)->data(), (*b)->data());
  EXPECT_EQ(FakeLiveObjects("host_register"), 2);
  a->reset();
  EXPECT_EQ(FakeLiveObjects("host_register"), 1);
  EXPECT_EQ((*b)->data()[1], 10);
  b->reset();
  EXPECT_EQ(FakeLiveObjects("host_register"), 0);
}

TEST_F(CudaHostImporterTest, RefusesCopyOnWriteAndWritableMappingsAndMapsNothing) {
  for (MapMode mode : {MapMode::kPrivate, MapMode::kSharedWritable}) {
    auto region = importer_.Import(HostBuffer(1), mode, "buffer 11");
    EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(region.status().message(),
                AllOf(HasSubstr("buffer 11: a pinned view is a shared read-only mapping"),
                      HasSubstr("copy every page")));
  }
  EXPECT_EQ(FakeLiveObjects("host_register"), 0);
}

TEST_F(CudaHostImporterTest, RefusesMemoryThatIsNotHostMemory) {
  CudaBackend backend;
  BackendDevice gpu;
  gpu.device.set_type(tensord::v1::DEVICE_TYPE_CUDA);
  gpu.device.set_index(0);
  auto allocation = backend.Allocate(gpu, 2 << 20, "t");
  ASSERT_TRUE(allocation.ok()) << allocation.status();
  FetchedBuffer buffer;
  buffer.buffer_id = 12;
  buffer.size = 2 << 20;
  buffer.device_type = tensord::v1::DEVICE_TYPE_CUDA;
  buffer.handle = *(*allocation)->Export();
  auto region = importer_.Import(buffer, MapMode::kSharedReadOnly, "acquire 'gpu/w': buffer 12");
  EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(region.status().message(),
              HasSubstr("acquire 'gpu/w': buffer 12: a pinned view is of host memory, and this is "
                        "DEVICE_TYPE_CUDA memory"));
}

TEST_F(CudaHostImporterTest, ARefusedRegistrationLeavesNothingMappedOrRegistered) {
  FakeFailNext("cuMemHostRegister_v2", CUDA_ERROR_OUT_OF_MEMORY);
  auto region = importer_.Import(HostBuffer(1), MapMode::kSharedReadOnly, "buffer 11");
  EXPECT_EQ(region.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(region.status().message(),
              HasSubstr("buffer 11: cuMemHostRegister of 12288 bytes on cuda device 0: CUDA_ERROR_OUT_OF_MEMORY"));
  EXPECT_EQ(FakeLiveObjects("host_register"), 0);
}

TEST_F(CudaHostImporterTest, ADeviceThatCannotPinReadOnlyMemoryIsNamed) {
  ::setenv("TENSORD_FAKE_CUDA_NO_READ_ONLY_HOST_REGISTER", "1", 1);
  auto region = importer_.Import(HostBuffer(1), MapMode::kSharedReadOnly, "buffer 11");
  ::unsetenv("TENSORD_FAKE_CUDA_NO_READ_ONLY_HOST_REGISTER");
  EXPECT_EQ(region.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(region.status().message(),
              AllOf(HasSubstr("buffer 11: cuda device 0 cannot pin read-only host memory"),
                    HasSubstr("READ_ONLY_HOST_REGISTER_SUPPORTED"), HasSubstr("acquire it unpinned")));
  EXPECT_EQ(FakeLiveObjects("host_register"), 0);
}

// The stand-in is as strict as cuda.h documents, so the importer's flags and order count.
TEST_F(CudaHostImporterTest, TheFakeDriverIsStrictAboutRegistrations) {
  auto region = HostImporter().Import(HostBuffer(1), MapMode::kSharedReadOnly, "buffer 11");
  ASSERT_TRUE(region.ok()) << region.status();
  void* p = (*region)->data();
  // No current context.
  EXPECT_EQ(driver_.cuMemHostRegister_v2(p, kSize, CU_MEMHOSTREGISTER_READ_ONLY), CUDA_ERROR_INVALID_CONTEXT);
  auto context = ScopedCudaContext::Push(driver_, 0);
  ASSERT_TRUE(context.ok()) << context.status();
  // A read-only mapping needs CU_MEMHOSTREGISTER_READ_ONLY.
  EXPECT_EQ(driver_.cuMemHostRegister_v2(p, kSize, CU_MEMHOSTREGISTER_PORTABLE), CUDA_ERROR_NOT_PERMITTED);
  EXPECT_EQ(driver_.cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  ASSERT_EQ(driver_.cuMemHostRegister_v2(p, kSize, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_READ_ONLY),
            CUDA_SUCCESS);
  EXPECT_EQ(driver_.cuMemHostRegister_v2(p, 4096, CU_MEMHOSTREGISTER_READ_ONLY),
            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(driver_.cuMemHostUnregister(static_cast<uint8_t*>(p) + 4096), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(FakeLiveObjects("host_register"), 1);
  EXPECT_EQ(driver_.cuMemHostUnregister(p), CUDA_SUCCESS);
  EXPECT_EQ(FakeLiveObjects("host_register"), 0);
}

// Without a driver, a pinned view says why and host imports keep working: a fresh process,
// since the driver loads once per process.
TEST(CudaHostImporterNoDriverTest, APinnedViewSaysWhyAndHostImportsStillWork) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::setenv("TENSORD_LIBCUDA", "/nonexistent/libcuda-missing.so.1", 1);
        CudaHostImporter importer(std::make_unique<HostImporter>());
        auto pinned = importer.Import(HostBuffer(3), MapMode::kSharedReadOnly, "buffer 11");
        auto plain = HostImporter().Import(HostBuffer(3), MapMode::kSharedReadOnly, "buffer 11");
        std::fprintf(stderr, "pinned=[%s]\n", pinned.status().ToString().c_str());
        const bool ok = pinned.status().code() == absl::StatusCode::kUnavailable && plain.ok() &&
                        (*plain)->data()[0] == 3;
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "pinned=\\[UNAVAILABLE: buffer 11: a pinned view needs the cuda driver: /nonexistent/libcuda-missing.so.1 "
      "not found \\(dlopen: .*\\): no NVIDIA driver on this machine\\]");
}

}  // namespace
}  // namespace tensord::common
