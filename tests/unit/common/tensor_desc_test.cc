#include "common/tensor_desc.h"

#include <initializer_list>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::common {
namespace {

using ::tensord::common::testing::IsOk;
using ::tensord::common::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::DataType DType(v1::DTypeCode code, uint32_t bits, uint32_t lanes = 1) {
  v1::DataType dtype;
  dtype.set_code(code);
  dtype.set_bits(bits);
  dtype.set_lanes(lanes);
  return dtype;
}

v1::TensorDesc Desc(std::initializer_list<int64_t> shape,
                    std::initializer_list<int64_t> strides = {},
                    v1::DataType dtype = DType(v1::DTYPE_CODE_FLOAT, 32)) {
  v1::TensorDesc desc;
  *desc.mutable_dtype() = dtype;
  for (int64_t d : shape) desc.add_shape(d);
  for (int64_t s : strides) desc.add_strides(s);
  desc.mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
  return desc;
}

TEST(ValidateDescTest, CompactTensorLayout) {
  auto layout = ValidateDesc(Desc({2, 3, 4}));
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->item_bytes, 4u);
  EXPECT_EQ(layout->num_elements, 24u);
  EXPECT_EQ(layout->nbytes, 96u);
  EXPECT_EQ(layout->extent, 96u);
  EXPECT_THAT(layout->strides, ElementsAre(12, 4, 1));
  EXPECT_TRUE(layout->c_contiguous);
}

TEST(ValidateDescTest, ScalarHasOneElement) {
  auto layout = ValidateDesc(Desc({}, {}, DType(v1::DTYPE_CODE_COMPLEX, 128)));
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->num_elements, 1u);
  EXPECT_EQ(layout->extent, 16u);
  EXPECT_TRUE(layout->strides.empty());
  EXPECT_TRUE(layout->c_contiguous);
}

TEST(ValidateDescTest, ByteOffsetAddsToExtent) {
  v1::TensorDesc desc = Desc({10});
  desc.set_byte_offset(64);
  auto layout = ValidateDesc(desc);
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->extent, 104u);
  EXPECT_EQ(layout->nbytes, 40u);
}

TEST(ValidateDescTest, ZeroSizeTensorHasNoExtent) {
  auto layout = ValidateDesc(Desc({3, 0, 5}));
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->num_elements, 0u);
  EXPECT_EQ(layout->nbytes, 0u);
  EXPECT_EQ(layout->extent, 0u);
  EXPECT_THAT(layout->strides, ElementsAre(5, 5, 1));  // zero dims step as 1, like numpy
  EXPECT_TRUE(layout->c_contiguous);
}

TEST(ValidateDescTest, FortranStridesAreValidButNotCContiguous) {
  auto layout = ValidateDesc(Desc({2, 3}, {1, 2}));
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->extent, 24u);
  EXPECT_THAT(layout->strides, ElementsAre(1, 2));
  EXPECT_FALSE(layout->c_contiguous);
}

TEST(ValidateDescTest, SizeOneDimensionMayHaveAnyStride) {
  auto layout = ValidateDesc(Desc({1, 4}, {1000000, 1}));
  ASSERT_THAT(layout, IsOk());
  EXPECT_TRUE(layout->c_contiguous);
  EXPECT_EQ(layout->extent, 16u);
}

TEST(ValidateDescTest, StridedViewReachesLastElement) {
  // Every other column of a 4x8 float32 matrix: last element at 3*8 + 3*2 = 30.
  auto layout = ValidateDesc(Desc({4, 4}, {8, 2}));
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->extent, 31u * 4);
  EXPECT_FALSE(layout->c_contiguous);
}

TEST(ValidateDescTest, BroadcastZeroStrideIsAccepted) {
  auto layout = ValidateDesc(Desc({1000, 3}, {0, 1}));
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->extent, 12u);
}

TEST(ValidateDescTest, RefusesNegativeDimension) {
  EXPECT_THAT(ValidateDesc(Desc({2, 3, -1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "desc.shape[2] is -1: dimensions must be >= 0"));
}

TEST(ValidateDescTest, RefusesNegativeStride) {
  EXPECT_THAT(ValidateDesc(Desc({2, 3}, {3, -1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.strides[1] is -1")));
}

TEST(ValidateDescTest, RefusesStridesOfWrongCount) {
  EXPECT_THAT(ValidateDesc(Desc({2, 3}, {1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.strides has 1")));
}

TEST(ValidateDescTest, RefusesTooManyDimensions) {
  v1::TensorDesc desc = Desc({});
  for (int i = 0; i < 33; ++i) desc.add_shape(1);
  EXPECT_THAT(ValidateDesc(desc),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("33 dimensions")));
  desc.mutable_shape()->RemoveLast();
  EXPECT_THAT(ValidateDesc(desc), IsOk());
}

TEST(ValidateDescTest, RefusesOverflowingShape) {
  EXPECT_THAT(ValidateDesc(Desc({int64_t{1} << 40, int64_t{1} << 40})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
  // Overflow in the element count alone, even with a zero dim elsewhere.
  EXPECT_THAT(ValidateDesc(Desc({0, INT64_MAX, INT64_MAX})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
  // Just over the byte cap: 2^48 float32 elements are 2^50 bytes (fine), 2^49 are not.
  EXPECT_THAT(ValidateDesc(Desc({int64_t{1} << 48})), IsOk());
  EXPECT_THAT(ValidateDesc(Desc({int64_t{1} << 49})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
}

TEST(ValidateDescTest, RefusesStridesThatReachTooFar) {
  EXPECT_THAT(ValidateDesc(Desc({2, 2}, {INT64_MAX, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.strides[0]")));
  EXPECT_THAT(ValidateDesc(Desc({3, 3}, {int64_t{1} << 49, int64_t{1} << 49})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.strides")));
}

TEST(ValidateDescTest, RefusesHugeByteOffset) {
  v1::TensorDesc desc = Desc({4});
  desc.set_byte_offset(UINT64_MAX - 4);
  EXPECT_THAT(ValidateDesc(desc),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.byte_offset")));
  desc.set_byte_offset(kMaxTensorBytes - 8);  // each fits, the sum does not
  EXPECT_THAT(ValidateDesc(desc),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("byte_offset")));
}

TEST(ValidateDescTest, RefusesUnknownDType) {
  EXPECT_THAT(ValidateDesc(Desc({1}, {}, DType(v1::DTYPE_CODE_UNSPECIFIED, 32))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.dtype.code is 0")));
  EXPECT_THAT(ValidateDesc(Desc({1}, {}, DType(static_cast<v1::DTypeCode>(4), 64))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.dtype.code is 4")));
  EXPECT_THAT(ValidateDesc(Desc({1}, {}, DType(v1::DTYPE_CODE_FLOAT, 8))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.dtype.bits is 8")));
  EXPECT_THAT(ValidateDesc(Desc({1}, {}, DType(v1::DTYPE_CODE_BOOL, 1))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.dtype.bits is 1")));
  EXPECT_THAT(ValidateDesc(Desc({1}, {}, DType(v1::DTYPE_CODE_COMPLEX, 32))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.dtype.bits")));
}

TEST(ValidateDescTest, RefusesLanesOtherThanOne) {
  EXPECT_THAT(ValidateDesc(Desc({1}, {}, DType(v1::DTYPE_CODE_FLOAT, 32, 0))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.dtype.lanes is 0")));
  EXPECT_THAT(ValidateDesc(Desc({1}, {}, DType(v1::DTYPE_CODE_FLOAT, 32, 2))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.dtype.lanes is 2")));
}

TEST(ValidateDescTest, ChecksDevice) {
  v1::TensorDesc desc = Desc({1});
  desc.mutable_device()->set_type(v1::DEVICE_TYPE_UNSPECIFIED);
  EXPECT_THAT(ValidateDesc(desc),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.device.type is 0")));
  desc.mutable_device()->set_type(static_cast<v1::DeviceType>(7));  // Vulkan
  EXPECT_THAT(ValidateDesc(desc),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.device.type is 7")));
  desc.mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
  desc.mutable_device()->set_index(1);
  EXPECT_THAT(ValidateDesc(desc),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.device.index is 1")));
  desc.mutable_device()->set_type(v1::DEVICE_TYPE_CUDA);
  EXPECT_THAT(ValidateDesc(desc), IsOk());
  desc.mutable_device()->set_index(-1);
  EXPECT_THAT(ValidateDesc(desc),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.device.index is -1")));
  desc.mutable_device()->set_index(0);
  desc.mutable_device()->set_uuid("short");
  EXPECT_THAT(ValidateDesc(desc),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.device.uuid")));
  desc.mutable_device()->set_type(v1::DEVICE_TYPE_ONEAPI);
  desc.mutable_device()->set_uuid(std::string(16, 'u'));
  EXPECT_THAT(ValidateDesc(desc), IsOk());
}

v1::BufferRef Buffer(uint64_t size, uint64_t offset, uint64_t extent = 0) {
  v1::BufferRef buffer;
  buffer.set_buffer_id(7);
  buffer.set_size(size);
  buffer.set_offset(offset);
  buffer.set_extent(extent);
  return buffer;
}

TEST(ValidateFitsBufferTest, ChecksOffsetPlusExtent) {
  auto layout = ValidateDesc(Desc({4, 4}));  // 64 bytes
  ASSERT_THAT(layout, IsOk());
  EXPECT_THAT(ValidateFitsBuffer(*layout, Buffer(64, 0), "tensor 1"), IsOk());
  EXPECT_THAT(ValidateFitsBuffer(*layout, Buffer(128, 64), "tensor 1"), IsOk());
  EXPECT_THAT(ValidateFitsBuffer(*layout, Buffer(128, 65), "tensor 1"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 1: extent of 64 bytes at offset 65")));
  EXPECT_THAT(ValidateFitsBuffer(*layout, Buffer(128, UINT64_MAX - 10), "tensor 1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor 1")));
}

TEST(ValidateFitsBufferTest, StridesOutsideBufferAreRefused) {
  // Column-strided view whose last element lies past a 64-byte buffer.
  auto layout = ValidateDesc(Desc({4, 4}, {5, 1}));
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->extent, 19u * 4);
  EXPECT_THAT(ValidateFitsBuffer(*layout, Buffer(64, 0), "tensor 2"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor 2")));
}

TEST(ValidateFitsBufferTest, StatedExtentBoundsTheTensor) {
  auto layout = ValidateDesc(Desc({4}));  // 16 bytes
  ASSERT_THAT(layout, IsOk());
  EXPECT_THAT(ValidateFitsBuffer(*layout, Buffer(1024, 0, 16), "t"), IsOk());
  EXPECT_THAT(ValidateFitsBuffer(*layout, Buffer(1024, 0, 8), "t"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stated extent")));
  EXPECT_THAT(ValidateFitsBuffer(*layout, Buffer(1024, 1000, 100), "t"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stated extent")));
}

TEST(ValidateFitsBufferTest, EmptyTensorFitsNoBuffer) {
  auto layout = ValidateDesc(Desc({0, 4}));
  ASSERT_THAT(layout, IsOk());
  EXPECT_THAT(ValidateFitsBuffer(*layout, v1::BufferRef(), "empty"), IsOk());
}

TEST(CompactStridesTest, RowMajor) {
  EXPECT_THAT(CompactStrides({2, 3, 4}), ElementsAre(12, 4, 1));
  EXPECT_THAT(CompactStrides({}), ElementsAre());
  EXPECT_THAT(CompactStrides({5}), ElementsAre(1));
}

struct NamedDType {
  const char* name;
  v1::DTypeCode code;
  uint32_t bits;
};

constexpr NamedDType kAllDTypes[] = {
    {"bool", v1::DTYPE_CODE_BOOL, 8},
    {"int8", v1::DTYPE_CODE_INT, 8},
    {"int16", v1::DTYPE_CODE_INT, 16},
    {"int32", v1::DTYPE_CODE_INT, 32},
    {"int64", v1::DTYPE_CODE_INT, 64},
    {"uint8", v1::DTYPE_CODE_UINT, 8},
    {"uint16", v1::DTYPE_CODE_UINT, 16},
    {"uint32", v1::DTYPE_CODE_UINT, 32},
    {"uint64", v1::DTYPE_CODE_UINT, 64},
    {"float16", v1::DTYPE_CODE_FLOAT, 16},
    {"float32", v1::DTYPE_CODE_FLOAT, 32},
    {"float64", v1::DTYPE_CODE_FLOAT, 64},
    {"bfloat16", v1::DTYPE_CODE_BFLOAT, 16},
    {"complex64", v1::DTYPE_CODE_COMPLEX, 64},
    {"complex128", v1::DTYPE_CODE_COMPLEX, 128},
};

TEST(DTypeTest, NamesRoundTrip) {
  for (const NamedDType& t : kAllDTypes) {
    SCOPED_TRACE(t.name);
    v1::DataType dtype = DType(t.code, t.bits);
    EXPECT_EQ(DTypeName(dtype), t.name);
    EXPECT_EQ(ItemBytes(dtype), t.bits / 8);
    EXPECT_THAT(ValidateDType(dtype, "dtype"), IsOk());
    auto parsed = ParseDTypeName(t.name);
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(parsed->code(), t.code);
    EXPECT_EQ(parsed->bits(), t.bits);
    EXPECT_EQ(parsed->lanes(), 1u);
  }
}

TEST(DTypeTest, RefusesUnknown) {
  EXPECT_THAT(ParseDTypeName("float128"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'float128' is unknown")));
  EXPECT_THAT(ParseDTypeName(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("''")));
  EXPECT_EQ(ItemBytes(DType(v1::DTYPE_CODE_INT, 12)), 0u);
  EXPECT_EQ(ItemBytes(DType(v1::DTYPE_CODE_INT, 32, 4)), 0u);
  EXPECT_THAT(DTypeName(DType(v1::DTYPE_CODE_INT, 12)), HasSubstr("invalid"));
  EXPECT_FALSE(KnownDTypeCode(4));  // DLPack's kDLOpaqueHandle, shifted
  EXPECT_THAT(ValidateDType(DType(v1::DTYPE_CODE_FLOAT, 32, 4), "dtype"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype.lanes is 4")));
  EXPECT_THAT(ValidateDType(DType(v1::DTYPE_CODE_FLOAT, 128), "dtype"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype.bits is 128")));
}

TEST(DeviceTest, ValidatesAlone) {
  for (auto [type, index] : {std::pair{v1::DEVICE_TYPE_CPU, 0}, std::pair{v1::DEVICE_TYPE_CUDA, 3},
                             std::pair{v1::DEVICE_TYPE_CUDA_HOST, 0},
                             std::pair{v1::DEVICE_TYPE_ONEAPI, 1}}) {
    v1::Device device;
    device.set_type(type);
    device.set_index(index);
    EXPECT_TRUE(KnownDeviceType(type));
    EXPECT_THAT(ValidateDevice(device, "device"), IsOk());
  }
  EXPECT_FALSE(KnownDeviceType(7));  // Vulkan
  v1::Device cpu2;
  cpu2.set_type(v1::DEVICE_TYPE_CPU);
  cpu2.set_index(2);
  EXPECT_THAT(ValidateDevice(cpu2, "device"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be 0 for a CPU")));
}

}  // namespace
}  // namespace tensord::common
