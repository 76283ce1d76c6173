// DeviceStager and its helper (tensord-stage) over the software CUDA stand-in
// (tests/fake_cuda): a real helper process imports a real VMM handle of the fake and copies
// through the cuda backend's stream order. It proves the plumbing, not the hardware.
#include "server/cluster/device_stager.h"

#include <signal.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/memory/backends.h"
#include "common/memory/cuda/cuda_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/fake_cuda_env.h"

namespace tensord::server::cluster {
namespace {

namespace v1 = tensord::v1;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1u << 20;

// A 4 MiB buffer of the fake's device 1, with its handle and this process's mapping of it.
struct Buffer {
  std::unique_ptr<common::BackendBuffer> memory;
  common::MemoryHandle handle;
  std::unique_ptr<common::ImportedRegion> region;
  DeviceBuffer device() const { return {.device_type = v1::DEVICE_TYPE_CUDA, .size = memory->size(), .handle = &handle}; }
};

class DeviceStagerTest : public ::testing::Test {
 protected:
  Buffer MakeBuffer() {
    common::BackendDevice device;
    device.device.set_type(v1::DEVICE_TYPE_CUDA);
    device.device.set_index(1);
    Buffer buffer;
    auto memory = backend_.Allocate(device, 4 * kMiB, "staged");
    EXPECT_TRUE(memory.ok()) << memory.status();
    buffer.memory = *std::move(memory);
    auto handle = buffer.memory->Export();
    EXPECT_TRUE(handle.ok()) << handle.status();
    buffer.handle = *std::move(handle);
    common::FetchedBuffer fetched;
    fetched.size = buffer.memory->size();
    fetched.device_type = v1::DEVICE_TYPE_CUDA;
    fetched.handle.data = buffer.handle.data;
    for (const common::UniqueFd& fd : buffer.handle.fds) fetched.handle.fds.emplace_back(::dup(fd.get()));
    auto importer = common::ProcessImporters().For(v1::DEVICE_TYPE_CUDA);
    EXPECT_TRUE(importer.ok());
    auto region = (*importer)->Import(fetched, common::MapMode::kSharedWritable, "the test's view");
    EXPECT_TRUE(region.ok()) << region.status();
    buffer.region = *std::move(region);
    return buffer;
  }

  // Writes `bytes` at `offset` of the device buffer through the driver, as a producer would.
  static void Write(const Buffer& buffer, uint64_t offset, const std::vector<uint8_t>& bytes) {
    const common::StreamOrder* order = buffer.region->stream_order();
    ASSERT_NE(order, nullptr);
    ASSERT_TRUE(order->CopyFromHost(buffer.region->data() + offset, bytes.data(), bytes.size(),
                                    buffer.region->device_ordinal(), "test write")
                    .ok());
  }
  static std::vector<uint8_t> ReadBack(const Buffer& buffer, uint64_t offset, uint64_t nbytes) {
    std::vector<uint8_t> bytes(nbytes);
    EXPECT_TRUE(buffer.region->stream_order()
                    ->CopyToHost(bytes.data(), buffer.region->data() + offset, nbytes, buffer.region->device_ordinal(),
                                 "test read")
                    .ok());
    return bytes;
  }
  static std::vector<uint8_t> Pattern(uint64_t nbytes, uint8_t seed) {
    std::vector<uint8_t> bytes(nbytes);
    for (uint64_t i = 0; i < nbytes; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + seed);
    return bytes;
  }

  common::CudaBackend backend_;
  DeviceStager stager_{TENSORD_STAGE_HELPER_PATH};
};

TEST_F(DeviceStagerTest, CopiesADeviceTensorToHostMemoryAndBack) {
  Buffer buffer = MakeBuffer();
  const uint64_t offset = kMiB + 64;
  const uint64_t nbytes = kMiB + 12;
  const std::vector<uint8_t> sent = Pattern(nbytes, 3);
  Write(buffer, offset, sent);
  auto copy = HostCopy::Make(nbytes, "shared/w");
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(stager_.ToHost(buffer.device(), offset, nbytes, "", (*copy)->fd(), "shared/w").ok());
  EXPECT_EQ(std::memcmp((*copy)->data(), sent.data(), nbytes), 0);
  const pid_t helper = stager_.helper_pid();
  EXPECT_GT(helper, 0);

  // Back to the device, elsewhere in the buffer, by the same helper.
  const std::vector<uint8_t> back = Pattern(nbytes, 11);
  std::memcpy((*copy)->data(), back.data(), nbytes);
  ASSERT_TRUE(stager_.ToDevice(buffer.device(), 0, nbytes, (*copy)->fd(), "shared/w").ok());
  EXPECT_EQ(ReadBack(buffer, 0, nbytes), back);
  EXPECT_EQ(ReadBack(buffer, offset, nbytes), sent) << "the tensor the first copy read was overwritten";
  EXPECT_EQ(stager_.helper_pid(), helper);
  EXPECT_EQ(stager_.copies(), 2u);
}

// The owner's copy waits for the producer's ready fence, on the host, in the helper.
TEST_F(DeviceStagerTest, ACopyToHostWaitsForTheProducersReadyFence) {
  Buffer buffer = MakeBuffer();
  const std::vector<uint8_t> sent = Pattern(4096, 5);
  Write(buffer, 0, sent);
  auto hold = reinterpret_cast<void (*)(int)>(common::testing::FakeSymbol("tensord_fake_cuda_hold_streams"));
  auto finish = reinterpret_cast<int (*)()>(common::testing::FakeSymbol("tensord_fake_cuda_finish_streams"));
  hold(1);
  auto fence = buffer.region->stream_order()->RecordReady(buffer.region->device_ordinal(), /*stream=*/1, "ready");
  ASSERT_TRUE(fence.ok()) << fence.status();
  auto copy = HostCopy::Make(sent.size(), "shared/f");
  ASSERT_TRUE(copy.ok());
  std::future<absl::Status> staged = std::async(std::launch::async, [&] {
    return stager_.ToHost(buffer.device(), 0, sent.size(), *fence, (*copy)->fd(), "shared/f");
  });
  EXPECT_EQ(staged.wait_for(std::chrono::milliseconds(500)), std::future_status::timeout)
      << "the copy did not wait for the producer's work";
  EXPECT_GE(finish(), 1);
  hold(0);
  ASSERT_EQ(staged.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(staged.get().ok());
  EXPECT_EQ(std::memcmp((*copy)->data(), sent.data(), sent.size()), 0);
}

TEST_F(DeviceStagerTest, AHelperThatDiedIsReplacedAtTheNextCopy) {
  Buffer buffer = MakeBuffer();
  auto copy = HostCopy::Make(kMiB, "shared/k");
  ASSERT_TRUE(copy.ok());
  ASSERT_TRUE(stager_.ToHost(buffer.device(), 0, kMiB, "", (*copy)->fd(), "shared/k").ok());
  const pid_t first = stager_.helper_pid();
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  absl::SleepFor(absl::Milliseconds(100));
  const std::vector<uint8_t> sent = Pattern(kMiB, 9);
  Write(buffer, 0, sent);
  absl::Status again = stager_.ToHost(buffer.device(), 0, kMiB, "", (*copy)->fd(), "shared/k");
  EXPECT_TRUE(again.ok()) << again;
  EXPECT_NE(stager_.helper_pid(), first);
  EXPECT_EQ(std::memcmp((*copy)->data(), sent.data(), kMiB), 0);
}

TEST_F(DeviceStagerTest, RefusalsNameWhatWasWrong) {
  Buffer buffer = MakeBuffer();
  auto copy = HostCopy::Make(kMiB, "shared/r");
  ASSERT_TRUE(copy.ok());
  absl::Status past_end = stager_.ToHost(buffer.device(), 4 * kMiB - 16, kMiB, "", (*copy)->fd(), "shared/r");
  EXPECT_EQ(past_end.code(), absl::StatusCode::kInvalidArgument) << past_end;
  EXPECT_THAT(std::string(past_end.message()), HasSubstr("shared/r"));

  common::MemoryHandle host_handle;
  host_handle.fds.emplace_back(::dup((*copy)->fd()));
  const DeviceBuffer host{.device_type = v1::DEVICE_TYPE_CPU, .size = kMiB, .handle = &host_handle};
  auto other = HostCopy::Make(kMiB, "shared/h");
  ASSERT_TRUE(other.ok());
  absl::Status not_device = stager_.ToHost(host, 0, kMiB, "", (*other)->fd(), "shared/h");
  EXPECT_EQ(not_device.code(), absl::StatusCode::kFailedPrecondition) << not_device;
  EXPECT_THAT(std::string(not_device.message()), HasSubstr("host memory needs no staging"));

  DeviceStager missing("/nonexistent/tensord-stage");
  absl::Status no_helper = missing.ToHost(buffer.device(), 0, kMiB, "", (*copy)->fd(), "shared/r");
  EXPECT_EQ(no_helper.code(), absl::StatusCode::kFailedPrecondition) << no_helper;
  EXPECT_THAT(std::string(no_helper.message()), HasSubstr("/nonexistent/tensord-stage"));
  EXPECT_EQ(missing.helper_pid(), 0);
}

}  // namespace
}  // namespace tensord::server::cluster
