// The memory-kind table: one description per kind, consistent with DLPack and the wire, and
// the names derived from it (device keys, user device names, wire names).
#include "common/memory/memory_kinds.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

#include "common/memory/device_names.h"
#include "tensord/v1/tensor.pb.h"

namespace tensord::common {
namespace {

TEST(MemoryKindsTest, HostComesFirstAndEveryKindIsDescribedOnce) {
  ASSERT_FALSE(MemoryKinds().empty());
  EXPECT_EQ(MemoryKinds().front().type, tensord::v1::DEVICE_TYPE_CPU);
  std::set<int> types;
  std::set<std::string_view> names;
  std::set<std::string_view> prefixes;
  for (const MemoryKind& kind : MemoryKinds()) {
    SCOPED_TRACE(std::string(kind.name));
    EXPECT_TRUE(types.insert(kind.type).second);
    EXPECT_TRUE(names.insert(kind.name).second);
    EXPECT_TRUE(prefixes.insert(kind.device_prefix).second);
    EXPECT_EQ(FindMemoryKind(kind.type), &kind);
    EXPECT_EQ(FindMemoryKindByPrefix(kind.device_prefix), &kind);
    // Memory the host cannot read has streams to order on; host memory has none.
    EXPECT_EQ(kind.host_readable, kind.streams == StreamRule::kNone);
  }
  // Every wire device type but UNSPECIFIED is a kind, and nothing else is.
  for (int type = tensord::v1::DeviceType_MIN; type <= tensord::v1::DeviceType_MAX; ++type) {
    if (!tensord::v1::DeviceType_IsValid(type)) continue;
    EXPECT_EQ(FindMemoryKind(type) != nullptr, type != tensord::v1::DEVICE_TYPE_UNSPECIFIED) << type;
  }
  EXPECT_EQ(FindMemoryKind(7), nullptr);
  EXPECT_EQ(FindMemoryKindByPrefix("gpu"), nullptr);
}

TEST(MemoryKindsTest, DeviceTypesAreDLPacksNumbers) {
  EXPECT_EQ(FindMemoryKindByPrefix("cpu")->type, 1);         // kDLCPU
  EXPECT_EQ(FindMemoryKindByPrefix("cuda")->type, 2);        // kDLCUDA
  EXPECT_EQ(FindMemoryKindByPrefix("cuda_host")->type, 3);   // kDLCUDAHost
  EXPECT_EQ(FindMemoryKindByPrefix("xpu")->type, 14);        // kDLOneAPI
}

TEST(MemoryKindsTest, UserDeviceNames) {
  EXPECT_EQ(DeviceName(1, 0), "cpu");
  EXPECT_EQ(DeviceName(2, 3), "cuda:3");
  EXPECT_EQ(DeviceName(3, 0), "cuda_host");
  EXPECT_EQ(DeviceName(14, 1), "xpu:1");
  EXPECT_EQ(DeviceName(9, 2), "device9:2");
}

TEST(MemoryKindsTest, WireNamesAndKeysComeFromTheTable) {
  EXPECT_EQ(KnownDeviceTypeNames(), "CPU, CUDA, CUDA_HOST or ONEAPI");
  EXPECT_EQ(WireTypeName(tensord::v1::DEVICE_TYPE_CUDA_HOST), "CUDA_HOST");
  EXPECT_EQ(BackendNameOf(tensord::v1::DEVICE_TYPE_ONEAPI), "level_zero");
  EXPECT_EQ(BackendNameOf(static_cast<tensord::v1::DeviceType>(9)), "device type 9");
  const std::string uuid(16, '\x11');
  EXPECT_EQ(FormatDeviceUuid(tensord::v1::DEVICE_TYPE_CUDA, uuid), "GPU-11111111-1111-1111-1111-111111111111");
  EXPECT_EQ(FormatDeviceUuid(tensord::v1::DEVICE_TYPE_ONEAPI, uuid), "11111111-1111-1111-1111-111111111111");
  tensord::v1::Device host;
  host.set_type(tensord::v1::DEVICE_TYPE_CPU);
  EXPECT_EQ(DeviceKey(host), "host");
  tensord::v1::Device gpu;
  gpu.set_type(tensord::v1::DEVICE_TYPE_ONEAPI);
  gpu.set_index(2);
  EXPECT_EQ(DeviceKey(gpu), "level_zero:2");
  gpu.set_uuid(uuid);
  EXPECT_EQ(DeviceKey(gpu), "level_zero:11111111-1111-1111-1111-111111111111");
}

}  // namespace
}  // namespace tensord::common
