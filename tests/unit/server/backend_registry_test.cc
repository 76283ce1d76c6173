#include "server/memory/backend_registry.h"

#include "common/memory/device_names.h"
#include "common/memory/host/host_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;
using common::testing::IsOk;
using common::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Uuid(char fill) { return std::string(16, fill); }

// A GPU backend as the registry sees it: devices, or the reason it has none.
class TwoGpus final : public common::MemoryBackend {
 public:
  explicit TwoGpus(std::string reason = "") : reason_(std::move(reason)) {}
  std::string_view name() const override { return "cuda"; }
  v1::DeviceType device_type() const override { return v1::DEVICE_TYPE_CUDA; }
  std::string unavailable_reason() const override { return reason_; }
  std::vector<common::BackendDevice> devices() const override {
    std::vector<common::BackendDevice> out;
    for (int i = 0; i < 2; ++i) {
      common::BackendDevice d;
      d.device.set_type(v1::DEVICE_TYPE_CUDA);
      d.device.set_index(i);
      d.device.set_uuid(Uuid(static_cast<char>(0x10 + i)));
      d.name = "Test GPU";
      d.total_bytes = uint64_t{80} << 30;
      out.push_back(d);
    }
    return out;
  }
  uint64_t RoundUp(const common::BackendDevice&, uint64_t size) const override { return size; }
  absl::StatusOr<std::unique_ptr<common::BackendBuffer>> Allocate(const common::BackendDevice&, uint64_t,
                                                                  const std::string&) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::StatusOr<std::unique_ptr<common::BackendBuffer>> Adopt(const common::BackendDevice&, common::MemoryHandle,
                                                               uint64_t, const std::string&) override {
    return absl::UnimplementedError("not in this test");
  }

 private:
  std::string reason_;
};

BackendRegistry Make(std::string cuda_reason = "", bool with_cuda = true) {
  std::vector<std::unique_ptr<common::MemoryBackend>> backends;
  backends.push_back(std::make_unique<common::HostBackend>());
  std::vector<common::MissingBackend> missing;
  if (with_cuda) {
    backends.push_back(std::make_unique<TwoGpus>(std::move(cuda_reason)));
  } else {
    missing.push_back({"cuda", v1::DEVICE_TYPE_CUDA, "this build found no cuda.h"});
  }
  missing.push_back({"level_zero", v1::DEVICE_TYPE_ONEAPI, "not built"});
  return BackendRegistry(std::move(backends), std::move(missing));
}

v1::Device Cuda(int index, std::string uuid = "") {
  v1::Device d;
  d.set_type(v1::DEVICE_TYPE_CUDA);
  d.set_index(index);
  d.set_uuid(std::move(uuid));
  return d;
}

TEST(BackendRegistry, HostAndGpusResolveByUuidBeforeOrdinal) {
  BackendRegistry registry = Make();
  v1::Device cpu;
  cpu.set_type(v1::DEVICE_TYPE_CPU);
  auto host = registry.Resolve(cpu);
  ASSERT_THAT(host, IsOk());
  EXPECT_EQ((*host)->key, "host");
  EXPECT_EQ((*host)->backend->name(), "host");

  // The caller's ordinal 0 is the daemon's device 1: the UUID decides.
  auto by_uuid = registry.Resolve(Cuda(0, Uuid(0x11)));
  ASSERT_THAT(by_uuid, IsOk());
  EXPECT_EQ((*by_uuid)->device.device.index(), 1);
  EXPECT_EQ((*by_uuid)->key, "cuda:GPU-11111111-1111-1111-1111-111111111111");
  auto by_ordinal = registry.Resolve(Cuda(0));
  ASSERT_THAT(by_ordinal, IsOk());
  EXPECT_EQ((*by_ordinal)->device.device.uuid(), Uuid(0x10));
  EXPECT_EQ(registry.devices().size(), 3u);
}

TEST(BackendRegistry, EveryFailureSaysWhy) {
  BackendRegistry registry = Make();
  EXPECT_THAT(registry.Resolve(Cuda(0, Uuid(0x7f))),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("no device GPU-7f7f7f7f"), HasSubstr("cuda:0 GPU-10101010"),
                             HasSubstr("cuda:1 GPU-11111111"))));
  EXPECT_THAT(registry.Resolve(Cuda(5)), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no device cuda:5")));
  v1::Device xpu;
  xpu.set_type(v1::DEVICE_TYPE_ONEAPI);
  EXPECT_THAT(registry.Resolve(xpu),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no level_zero backend: not built")));
  v1::Device pinned;
  pinned.set_type(v1::DEVICE_TYPE_CUDA_HOST);
  EXPECT_THAT(registry.Resolve(pinned), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("DEVICE_TYPE_CUDA_HOST")));

  BackendRegistry no_driver = Make("libcuda.so.1 not found: no NVIDIA driver on this machine");
  EXPECT_THAT(no_driver.Resolve(Cuda(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the cuda backend is unavailable: libcuda.so.1 not found")));
  EXPECT_EQ(no_driver.devices().size(), 1u);  // host memory keeps working
  BackendRegistry not_built = Make("", false);
  EXPECT_THAT(not_built.Resolve(Cuda(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no cuda backend: this build found no cuda.h")));
}

TEST(BackendRegistry, DescribeListsEveryBackendBuiltOrNot) {
  BackendRegistry registry = Make("no CUDA device");
  std::vector<v1::BackendStatus> described = registry.Describe();
  ASSERT_EQ(described.size(), 3u);
  EXPECT_EQ(described[0].name(), "host");
  EXPECT_TRUE(described[0].built());
  EXPECT_EQ(described[0].devices_size(), 1);
  EXPECT_EQ(described[1].name(), "cuda");
  EXPECT_TRUE(described[1].built());
  EXPECT_EQ(described[1].unavailable_reason(), "no CUDA device");
  EXPECT_EQ(described[1].devices_size(), 0);
  EXPECT_EQ(described[2].name(), "level_zero");
  EXPECT_FALSE(described[2].built());
}

TEST(DeviceNames, KeysNameDevicesTheSameWayInEveryProcess) {
  EXPECT_EQ(common::FormatDeviceUuid(v1::DEVICE_TYPE_CUDA, std::string("\x3f\x1c\x2a\x9e\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b", 16)),
            "GPU-3f1c2a9e-0001-0203-0405-060708090a0b");
  EXPECT_EQ(common::FormatDeviceUuid(v1::DEVICE_TYPE_ONEAPI, Uuid(0x01)), "01010101-0101-0101-0101-010101010101");
  EXPECT_EQ(common::FormatDeviceUuid(v1::DEVICE_TYPE_CUDA, "ab"), "6162");
  v1::Device cpu;
  cpu.set_type(v1::DEVICE_TYPE_CPU);
  EXPECT_EQ(common::DeviceKey(cpu), "host");
  EXPECT_EQ(common::DeviceKey(Cuda(3)), "cuda:3");
  EXPECT_EQ(common::DeviceKey(Cuda(3, Uuid(0x22))), "cuda:GPU-22222222-2222-2222-2222-222222222222");
}

}  // namespace
}  // namespace tensord::server
