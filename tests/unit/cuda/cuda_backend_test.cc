#include "common/memory/cuda/cuda_backend.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/fake_cuda_env.h"

namespace tensord::common {
namespace {

using ::testing::HasSubstr;
using testing::FakeFailNext;
using testing::FakeLiveObjects;
using testing::FakePrimaryContextRetains;
using testing::FakeUuid;

constexpr uint64_t kMiB = 1u << 20;

BackendDevice Cuda(int index, std::string uuid = "") {
  BackendDevice d;
  d.device.set_type(tensord::v1::DEVICE_TYPE_CUDA);
  d.device.set_index(index);
  d.device.set_uuid(uuid);
  return d;
}

std::string LegacyBytes(const std::string& uuid, uint64_t size, uint64_t offset) {
  CudaHandle h;
  h.kind = CudaHandleKind::kLegacyIpc;
  h.uuid = uuid;
  h.size = size;
  h.offset = offset;
  h.ipc_handle.fill(0x5a);
  return EncodeCudaHandle(h);
}

class CudaBackendTest : public ::testing::Test {
 protected:
  CudaBackend backend_;
};

TEST_F(CudaBackendTest, ServesEveryVisibleDeviceByUuid) {
  EXPECT_EQ(backend_.name(), "cuda");
  EXPECT_EQ(backend_.device_type(), tensord::v1::DEVICE_TYPE_CUDA);
  EXPECT_EQ(backend_.unavailable_reason(), "");
  auto devices = backend_.devices();
  ASSERT_EQ(devices.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(devices[i].device.type(), tensord::v1::DEVICE_TYPE_CUDA);
    EXPECT_EQ(devices[i].device.index(), i);
    EXPECT_EQ(devices[i].device.uuid(), FakeUuid(i));
    EXPECT_EQ(devices[i].name, "tensord fake CUDA device " + std::to_string(i));
    EXPECT_EQ(devices[i].total_bytes, 16ull << 30);
  }
}

TEST_F(CudaBackendTest, RoundUpUsesTheDeviceGranularity) {
  EXPECT_EQ(backend_.RoundUp(Cuda(0), 0), 0u);
  EXPECT_EQ(backend_.RoundUp(Cuda(0), 1), 2 * kMiB);
  EXPECT_EQ(backend_.RoundUp(Cuda(1), 2 * kMiB), 2 * kMiB);
  EXPECT_EQ(backend_.RoundUp(Cuda(1), 2 * kMiB + 1), 4 * kMiB);
  EXPECT_EQ(backend_.RoundUp(Cuda(0), std::numeric_limits<uint64_t>::max() - 5),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(backend_.RoundUp(Cuda(7), 1), std::numeric_limits<uint64_t>::max());
}

TEST_F(CudaBackendTest, AllocateExportsAVmmHandleAndAnFd) {
  const int before = FakeLiveObjects();
  {
    auto buffer = backend_.Allocate(Cuda(1, FakeUuid(1)), 4 * kMiB, "t1");
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_EQ((*buffer)->size(), 4 * kMiB);
    EXPECT_EQ(FakeLiveObjects("allocation"), 1);
    EXPECT_TRUE((*buffer)->CheckShareable("tensor 1").ok());

    auto exported = (*buffer)->Export();
    ASSERT_TRUE(exported.ok()) << exported.status();
    auto handle = DecodeCudaHandle(exported->data);
    ASSERT_TRUE(handle.ok()) << handle.status();
    EXPECT_EQ(handle->kind, CudaHandleKind::kVmmFd);
    EXPECT_EQ(handle->uuid, FakeUuid(1));
    EXPECT_EQ(handle->size, 4 * kMiB);
    ASSERT_EQ(exported->fds.size(), 1u);
    struct stat st;
    ASSERT_EQ(::fstat(exported->fds[0].get(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), 4 * kMiB);

    auto again = (*buffer)->Export();
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(again->fds.size(), 1u);
    EXPECT_NE(again->fds[0].get(), exported->fds[0].get());  // a dup per export
  }
  EXPECT_EQ(FakeLiveObjects(), before);  // the destructor released the allocation
}

TEST_F(CudaBackendTest, TheDaemonMakesNoContext) {
  auto buffer = backend_.Allocate(Cuda(0), 2 * kMiB, "t2");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_TRUE((*buffer)->Export().ok());
  buffer->reset();
  EXPECT_EQ(FakePrimaryContextRetains(0), 0);
  EXPECT_EQ(FakePrimaryContextRetains(1), 0);
}

TEST_F(CudaBackendTest, AllocateRefusesWhatItDoesNotServe) {
  auto unrounded = backend_.Allocate(Cuda(0), kMiB, "t3");
  EXPECT_EQ(unrounded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unrounded.status().message(), HasSubstr("not a multiple of the granularity 2097152"));
  EXPECT_EQ(backend_.Allocate(Cuda(0), 0, "t3").status().code(), absl::StatusCode::kInvalidArgument);
  auto unknown = backend_.Allocate(Cuda(5), 2 * kMiB, "t3");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("cuda device 5 is not served here"));
  auto other_uuid = backend_.Allocate(Cuda(0, FakeUuid(1)), 2 * kMiB, "t3");
  EXPECT_EQ(other_uuid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other_uuid.status().message(), HasSubstr("cuda device 0 is GPU-8a3f1c5e-2241-4b7d-9c0e-6f1355a20000, "
                                                       "not GPU-8a3f1c5e-2241-4b7d-9c0e-6f1355a20001"));
}

TEST_F(CudaBackendTest, OutOfDeviceMemoryIsResourceExhausted) {
  const int before = FakeLiveObjects();
  FakeFailNext("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY);
  auto buffer = backend_.Allocate(Cuda(1), 2 * kMiB, "weights");
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(buffer.status().message(),
            "cuMemCreate of 2097152 bytes on cuda:1 (GPU-8a3f1c5e-2241-4b7d-9c0e-6f1355a20001) for weights: "
            "CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  EXPECT_EQ(FakeLiveObjects(), before);
}

TEST_F(CudaBackendTest, AFailedExportReleasesTheAllocation) {
  const int before = FakeLiveObjects();
  FakeFailNext("cuMemExportToShareableHandle", CUDA_ERROR_NOT_SUPPORTED);
  auto buffer = backend_.Allocate(Cuda(0), 2 * kMiB, "t4");
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(buffer.status().message(), HasSubstr("as a POSIX fd: CUDA_ERROR_NOT_SUPPORTED"));
  EXPECT_EQ(FakeLiveObjects(), before);
}

TEST_F(CudaBackendTest, AdoptKeepsTheProducersIpcBytes) {
  const std::string bytes = LegacyBytes(FakeUuid(1), 8 * kMiB, 4096);
  MemoryHandle handle;
  handle.data = bytes;
  auto buffer = backend_.Adopt(Cuda(1, FakeUuid(1)), std::move(handle), 8 * kMiB - 4096, "tensor 9");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ((*buffer)->size(), 8 * kMiB - 4096);
  EXPECT_TRUE((*buffer)->CheckShareable("tensor 9").ok());
  auto exported = (*buffer)->Export();
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->data, bytes);
  EXPECT_TRUE(exported->fds.empty());
}

TEST_F(CudaBackendTest, AdoptRefusesBadHandles) {
  auto adopt = [&](std::string data, uint64_t size, int fds = 0, int device = 1) {
    MemoryHandle handle;
    handle.data = std::move(data);
    for (int i = 0; i < fds; ++i) handle.fds.emplace_back(::dup(0));
    return backend_.Adopt(Cuda(device), std::move(handle), size, "tensor 9").status();
  };
  absl::Status with_fd = adopt(LegacyBytes(FakeUuid(1), 2 * kMiB, 0), kMiB, 1);
  EXPECT_EQ(with_fd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(with_fd.message(), HasSubstr("tensor 9: a cuda IPC handle carries no fd, got 1"));

  absl::Status garbage = adopt("not a handle at all", kMiB);
  EXPECT_EQ(garbage.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(garbage.message(), HasSubstr("tensor 9: cuda handle: wrong magic"));

  CudaHandle vmm;
  vmm.uuid = FakeUuid(1);
  vmm.size = 2 * kMiB;
  absl::Status vmm_status = adopt(EncodeCudaHandle(vmm), kMiB);
  EXPECT_EQ(vmm_status.code(), absl::StatusCode::kUnimplemented);

  absl::Status wrong_device = adopt(LegacyBytes(FakeUuid(0), 2 * kMiB, 0), kMiB);
  EXPECT_EQ(wrong_device.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_device.message(), HasSubstr("the handle is for GPU-8a3f1c5e-2241-4b7d-9c0e-6f1355a20000, not cuda:1"));

  absl::Status too_big = adopt(LegacyBytes(FakeUuid(1), 2 * kMiB, 4096), 2 * kMiB);
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.message(), HasSubstr("2097152 bytes do not fit the allocation of 2097152 bytes from offset 4096"));
}

TEST(CudaBackendUnavailableTest, NoDeviceMakesAnUnavailableBackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::setenv("TENSORD_FAKE_CUDA_DEVICES", "0", 1);
        CudaBackend backend;
        auto buffer = backend.Allocate(Cuda(0), 2 * kMiB, "t");
        std::fprintf(stderr, "reason=[%s] devices=%zu allocate=%s\n", backend.unavailable_reason().c_str(),
                     backend.devices().size(), buffer.status().ToString().c_str());
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0),
      "reason=\\[no CUDA device: cuInit: CUDA_ERROR_NO_DEVICE .*\\] devices=0 allocate=UNAVAILABLE: cuda: no CUDA device");
}

TEST(CudaBackendUnavailableTest, MissingDriverMakesAnUnavailableBackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::setenv("TENSORD_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
        CudaBackend backend;
        std::fprintf(stderr, "reason=[%s] devices=%zu\n", backend.unavailable_reason().c_str(),
                     backend.devices().size());
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "reason=\\[/nonexistent/libcuda.so.1 not found \\(dlopen: .*\\] devices=0");
}

}  // namespace
}  // namespace tensord::common
