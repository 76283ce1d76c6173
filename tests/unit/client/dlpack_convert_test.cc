#include "client/dlpack_convert.h"

#include <string>
#include <tuple>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::internal {
namespace {

using ::tensord::common::testing::IsOk;
using ::tensord::common::testing::StatusIs;
using ::testing::HasSubstr;

struct DLPackDType {
  const char* name;
  v1::DTypeCode code;
  uint32_t bits;
  uint8_t dl_code;
};

constexpr DLPackDType kAllDTypes[] = {
    {"bool", v1::DTYPE_CODE_BOOL, 8, kDLBool},
    {"int8", v1::DTYPE_CODE_INT, 8, kDLInt},
    {"int16", v1::DTYPE_CODE_INT, 16, kDLInt},
    {"int32", v1::DTYPE_CODE_INT, 32, kDLInt},
    {"int64", v1::DTYPE_CODE_INT, 64, kDLInt},
    {"uint8", v1::DTYPE_CODE_UINT, 8, kDLUInt},
    {"uint16", v1::DTYPE_CODE_UINT, 16, kDLUInt},
    {"uint32", v1::DTYPE_CODE_UINT, 32, kDLUInt},
    {"uint64", v1::DTYPE_CODE_UINT, 64, kDLUInt},
    {"float16", v1::DTYPE_CODE_FLOAT, 16, kDLFloat},
    {"float32", v1::DTYPE_CODE_FLOAT, 32, kDLFloat},
    {"float64", v1::DTYPE_CODE_FLOAT, 64, kDLFloat},
    {"bfloat16", v1::DTYPE_CODE_BFLOAT, 16, kDLBfloat},
    {"complex64", v1::DTYPE_CODE_COMPLEX, 64, kDLComplex},
    {"complex128", v1::DTYPE_CODE_COMPLEX, 128, kDLComplex},
};

TEST(DLPackConvertTest, DTypesRoundTrip) {
  for (const DLPackDType& t : kAllDTypes) {
    SCOPED_TRACE(t.name);
    v1::DataType dtype;
    dtype.set_code(t.code);
    dtype.set_bits(t.bits);
    dtype.set_lanes(1);
    DLDataType dl = ToDLDataType(dtype);
    EXPECT_EQ(dl.code, t.dl_code);
    EXPECT_EQ(dl.bits, t.bits);
    EXPECT_EQ(dl.lanes, 1);
    auto back = FromDLDataType(dl);
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(back->code(), t.code);
    EXPECT_EQ(back->bits(), t.bits);
    EXPECT_EQ(back->lanes(), 1u);
  }
}

TEST(DLPackConvertTest, RefusesUnknownDTypes) {
  EXPECT_THAT(FromDLDataType(DLDataType{kDLOpaqueHandle, 64, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dlpack dtype.code is 3")));
  EXPECT_THAT(FromDLDataType(DLDataType{kDLFloat, 32, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lanes is 4")));
  EXPECT_THAT(FromDLDataType(DLDataType{kDLFloat, 128, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bits is 128")));
}

// The public names (tensord::DTypeName, what tensorctl and .npy files use) are the wire's.
TEST(DLPackConvertTest, PublicDTypeNamesAreTheWireNames) {
  for (const DLPackDType& t : kAllDTypes) {
    SCOPED_TRACE(t.name);
    const DLDataType dl{t.dl_code, static_cast<uint8_t>(t.bits), 1};
    Result<std::string> name = tensord::DTypeName(dl);
    ASSERT_TRUE(name.ok()) << name.status().ToString();
    EXPECT_EQ(*name, t.name);
    Result<DLDataType> back = tensord::ParseDTypeName(t.name);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->code, t.dl_code);
    EXPECT_EQ(back->bits, t.bits);
    EXPECT_EQ(back->lanes, 1);
  }
  Result<std::string> opaque = tensord::DTypeName(DLDataType{kDLOpaqueHandle, 64, 1});
  EXPECT_EQ(opaque.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(opaque.status().message(), HasSubstr("dlpack dtype.code is 3"));
  EXPECT_EQ(tensord::DTypeName(DLDataType{kDLFloat, 32, 4}).status().code(), StatusCode::kInvalidArgument);
  Result<DLDataType> unknown = tensord::ParseDTypeName("float8");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("dtype 'float8' is unknown"));
}

TEST(DLPackConvertTest, PublicTensorStateNames) {
  EXPECT_STREQ(tensord::TensorStateName(TensorState::kCreating), "creating");
  EXPECT_STREQ(tensord::TensorStateName(TensorState::kSealed), "sealed");
  EXPECT_STREQ(tensord::TensorStateName(TensorState::kRetired), "retired");
}

TEST(DLPackConvertTest, PublicMemoryKindsAndDeviceNames) {
  ASSERT_FALSE(tensord::MemoryKinds().empty());
  EXPECT_EQ(tensord::MemoryKinds().front().device_type, kDLCPU);
  const tensord::MemoryKindInfo* cuda = tensord::FindMemoryKind(kDLCUDA);
  ASSERT_NE(cuda, nullptr);
  EXPECT_EQ(cuda->name, "cuda");
  EXPECT_EQ(cuda->streams, tensord::MemoryKindInfo::StreamRule::kCuda);
  const tensord::MemoryKindInfo* pinned = tensord::FindMemoryKind(kDLCUDAHost);
  ASSERT_NE(pinned, nullptr);
  EXPECT_TRUE(pinned->host_readable);
  EXPECT_FALSE(pinned->own_memory);
  EXPECT_EQ(tensord::FindMemoryKind(kDLOneAPI)->streams, tensord::MemoryKindInfo::StreamRule::kHostWait);
  EXPECT_EQ(tensord::FindMemoryKind(kDLVulkan), nullptr);

  EXPECT_EQ(tensord::DeviceName(DLDevice{kDLCUDA, 1}), "cuda:1");
  EXPECT_EQ(tensord::DeviceName(DLDevice{kDLCUDAHost, 0}), "cuda_host");
  for (auto [text, type, id] : {std::tuple{"cpu", kDLCPU, 0}, std::tuple{"cuda", kDLCUDA, 0},
                                std::tuple{"cuda:3", kDLCUDA, 3}, std::tuple{"xpu:1", kDLOneAPI, 1}}) {
    Result<DLDevice> device = tensord::ParseDeviceName(text);
    ASSERT_TRUE(device.ok()) << text << ": " << device.status().ToString();
    EXPECT_EQ(device->device_type, type) << text;
    EXPECT_EQ(device->device_id, id) << text;
  }
  // A view is asked for (pinned), never named as a device; ordinals are digits only.
  for (const char* bad : {"gpu0", "cuda_host", "cuda:", "cuda:-1", "cuda:1x", "xpu:one", ""}) {
    Result<DLDevice> device = tensord::ParseDeviceName(bad);
    EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(device.status().message(), HasSubstr("give 'cpu', 'cuda', 'cuda:N', 'xpu', 'xpu:N'")) << bad;
  }
}

TEST(DLPackConvertTest, DevicesRoundTrip) {
  for (auto [type, index] : {std::pair{kDLCPU, 0}, std::pair{kDLCUDA, 3},
                             std::pair{kDLCUDAHost, 0}, std::pair{kDLOneAPI, 1}}) {
    auto device = FromDLDevice(DLDevice{type, index});
    ASSERT_THAT(device, IsOk());
    EXPECT_EQ(device->type(), static_cast<int>(type));
    DLDevice back = ToDLDevice(*device);
    EXPECT_EQ(back.device_type, type);
    EXPECT_EQ(back.device_id, index);
  }
  EXPECT_THAT(FromDLDevice(DLDevice{kDLVulkan, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_type is 7")));
  EXPECT_THAT(FromDLDevice(DLDevice{kDLCPU, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be 0 for a CPU")));
  EXPECT_THAT(FromDLDevice(DLDevice{kDLCUDA, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(">= 0")));
}

}  // namespace
}  // namespace tensord::internal
