// Tensor-description validation (common/tensor_desc.h) against hostile descriptions: the
// input is either a serialized TensorDesc or field values drawn from the bytes, biased to
// the edges (0, -1, INT64_MIN/MAX, powers of two near kMaxTensorBytes).
//
// Invariants: an accepted description's layout equals an independent 128-bit computation
// (element count, bytes, extent, strides, contiguity), every element of a small tensor lies
// inside its extent and the last one ends exactly there, ValidateFitsBuffer accepts exactly
// the buffers that hold the extent, and the dtype and device survive the DLPack round trip
// (the client's conversions, client/dlpack_convert.h, compiled in); a refused one gets
// INVALID_ARGUMENT naming a desc field.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "client/dlpack_convert.h"
#include "common/tensor_desc.h"
#include "google/protobuf/stubs/logging.h"
#include "tests/fuzz/fuzz_check.h"

namespace tensord::common {
namespace {

using tensord::internal::FromDLDataType;
using tensord::internal::FromDLDevice;
using tensord::internal::ToDLDataType;
using tensord::internal::ToDLDevice;
using tensord::v1::BufferRef;
using tensord::v1::TensorDesc;
using u128 = unsigned __int128;

int64_t EdgyInt64(FuzzedDataProvider& in) {
  static constexpr int64_t kEdges[] = {
      0, 1, 2, 3, 7, -1, -2, std::numeric_limits<int64_t>::min(),
      std::numeric_limits<int64_t>::max(), int64_t{1} << 25, int64_t{1} << 32,
      int64_t{1} << 47, int64_t{1} << 50, (int64_t{1} << 50) + 1, int64_t{1} << 62};
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: return in.PickValueInArray(kEdges);
    case 1: return in.ConsumeIntegralInRange<int64_t>(0, 16);
    case 2: return in.ConsumeIntegralInRange<int64_t>(-4, 4096);
    default: return in.ConsumeIntegral<int64_t>();
  }
}

uint64_t EdgyUint64(FuzzedDataProvider& in) {
  static constexpr uint64_t kEdges[] = {
      0, 1, 4096, kMaxTensorBytes - 1, kMaxTensorBytes, kMaxTensorBytes + 1,
      std::numeric_limits<uint64_t>::max(), std::numeric_limits<uint64_t>::max() - 1,
      uint64_t{1} << 63};
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: return in.PickValueInArray(kEdges);
    case 1: return in.ConsumeIntegralInRange<uint64_t>(0, 1 << 16);
    default: return in.ConsumeIntegral<uint64_t>();
  }
}

TensorDesc BuildDesc(FuzzedDataProvider& in) {
  TensorDesc desc;
  desc.mutable_dtype()->set_code(
      static_cast<tensord::v1::DTypeCode>(in.ConsumeIntegralInRange<int>(-1, 9)));
  static constexpr uint32_t kBits[] = {0, 1, 8, 16, 32, 64, 128, 256, 0xffffffff};
  desc.mutable_dtype()->set_bits(in.ConsumeBool() ? in.PickValueInArray(kBits)
                                                  : in.ConsumeIntegral<uint32_t>());
  desc.mutable_dtype()->set_lanes(in.ConsumeBool() ? 1 : in.ConsumeIntegral<uint32_t>());
  int ndim = in.ConsumeIntegralInRange<int>(0, kMaxNdim + 2);
  for (int i = 0; i < ndim; ++i) desc.add_shape(EdgyInt64(in));
  int nstrides = in.ConsumeBool() ? 0 : in.ConsumeBool() ? ndim : in.ConsumeIntegralInRange<int>(0, 34);
  for (int i = 0; i < nstrides; ++i) desc.add_strides(EdgyInt64(in));
  if (in.ConsumeBool()) desc.set_byte_offset(EdgyUint64(in));
  desc.mutable_device()->set_type(
      static_cast<tensord::v1::DeviceType>(in.ConsumeIntegralInRange<int>(-1, 15)));
  desc.mutable_device()->set_index(in.ConsumeBool() ? 0 : in.ConsumeIntegral<int32_t>());
  if (in.ConsumeBool()) desc.mutable_device()->set_uuid(in.ConsumeRandomLengthString(20));
  return desc;
}

// The layout computed without shortcuts, in 128 bits (no overflow for 32 dims of < 2^63).
struct Reference {
  bool fits = true;  // every quantity within kMaxTensorBytes
  u128 elements = 1;
  u128 extent = 0;
};

Reference Compute(const TensorDesc& desc, uint64_t item_bytes, const std::vector<int64_t>& strides) {
  Reference ref;
  // Zero dims aside, the element count times the item size must stay bounded.
  u128 nonzero = 1;
  bool any_zero = false;
  for (int64_t dim : desc.shape()) {
    if (dim == 0) {
      any_zero = true;
      continue;
    }
    nonzero *= static_cast<u128>(dim);
    if (nonzero * item_bytes > kMaxTensorBytes) ref.fits = false;
    if (!ref.fits) break;
  }
  ref.elements = any_zero ? 0 : nonzero;
  if (!ref.fits || ref.elements == 0) return ref;
  u128 max_offset = 0;
  for (int i = 0; i < desc.shape_size(); ++i) {
    u128 reach = static_cast<u128>(desc.shape(i) - 1) * static_cast<u128>(strides[i]);
    if (reach > kMaxTensorBytes) ref.fits = false;
    max_offset += reach;
    if (max_offset > kMaxTensorBytes) ref.fits = false;
    if (!ref.fits) return ref;
  }
  u128 reach_bytes = (max_offset + 1) * item_bytes;
  ref.extent = desc.byte_offset() + reach_bytes;
  if (reach_bytes > kMaxTensorBytes || ref.extent > kMaxTensorBytes) ref.fits = false;
  return ref;
}

bool ReferenceCContiguous(const TensorDesc& desc, const std::vector<int64_t>& strides) {
  u128 step = 1;
  for (int i = desc.shape_size(); i-- > 0;) {
    if (desc.shape(i) == 0) return true;
  }
  for (int i = desc.shape_size(); i-- > 0;) {
    if (desc.shape(i) != 1 && static_cast<u128>(strides[i]) != step) return false;
    step *= static_cast<u128>(desc.shape(i) > 1 ? desc.shape(i) : 1);
  }
  return true;
}

// Walks every element of a small tensor: each lies inside the extent, the furthest ends at it.
void CheckElementsInsideExtent(const TensorDesc& desc, const TensorLayout& layout) {
  if (layout.num_elements == 0 || layout.num_elements > 4096) return;
  std::vector<int64_t> index(desc.shape_size(), 0);
  uint64_t furthest_end = 0;
  for (uint64_t n = 0; n < layout.num_elements; ++n) {
    u128 offset = 0;
    for (int i = 0; i < desc.shape_size(); ++i) {
      offset += static_cast<u128>(index[i]) * static_cast<u128>(layout.strides[i]);
    }
    u128 end = desc.byte_offset() + (offset + 1) * layout.item_bytes;
    FUZZ_CHECK(end <= layout.extent) << "element " << n << " ends past the extent "
                                     << layout.extent;
    if (end > furthest_end) furthest_end = static_cast<uint64_t>(end);
    for (int i = desc.shape_size(); i-- > 0;) {
      if (++index[i] < desc.shape(i)) break;
      index[i] = 0;
    }
  }
  FUZZ_CHECK(furthest_end == layout.extent) << "the furthest element ends at " << furthest_end
                                            << ", the extent says " << layout.extent;
}

void CheckFitsBuffer(FuzzedDataProvider& in, const TensorLayout& layout) {
  BufferRef buffer;
  buffer.set_buffer_id(in.ConsumeIntegral<uint64_t>());
  buffer.set_size(in.ConsumeBool() ? layout.extent + in.ConsumeIntegralInRange<uint64_t>(0, 64)
                                   : EdgyUint64(in));
  buffer.set_offset(in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 64) : EdgyUint64(in));
  if (in.ConsumeBool()) {
    buffer.set_extent(in.ConsumeBool() ? layout.extent + in.ConsumeIntegralInRange<uint64_t>(0, 8)
                                       : EdgyUint64(in));
  }
  u128 end = static_cast<u128>(buffer.offset()) + layout.extent;
  bool expected = end <= buffer.size();
  if (buffer.extent() != 0) {
    expected = expected && layout.extent <= buffer.extent() &&
               static_cast<u128>(buffer.offset()) + buffer.extent() <= buffer.size();
  }
  absl::Status fits = ValidateFitsBuffer(layout, buffer, "fuzzed tensor");
  FUZZ_CHECK(fits.ok() == expected) << fits << " for offset " << buffer.offset() << " extent "
                                    << buffer.extent() << " size " << buffer.size();
  if (!fits.ok()) {
    FUZZ_CHECK(fits.code() == absl::StatusCode::kInvalidArgument) << fits;
    FUZZ_CHECK(fits.message().find("fuzzed tensor") != absl::string_view::npos) << fits;
  }
}

void CheckDesc(FuzzedDataProvider& in, const TensorDesc& desc) {
  absl::StatusOr<TensorLayout> layout = ValidateDesc(desc);
  if (!layout.ok()) {
    FUZZ_CHECK(layout.status().code() == absl::StatusCode::kInvalidArgument) << layout.status();
    FUZZ_CHECK(layout.status().message().substr(0, 4) == "desc") << layout.status();
    // Bounded by kMaxNdim dimensions of at most 20 digits each.
    FUZZ_CHECK(fuzz::IsReadableMessage(layout.status().message(), 2048)) << layout.status();
    return;
  }
  FUZZ_CHECK(desc.shape_size() <= kMaxNdim);
  for (int64_t dim : desc.shape()) FUZZ_CHECK(dim >= 0) << dim;
  FUZZ_CHECK(layout->strides.size() == static_cast<size_t>(desc.shape_size()));
  for (int64_t stride : layout->strides) FUZZ_CHECK(stride >= 0) << stride;
  if (desc.strides_size() == 0) {
    FUZZ_CHECK(layout->strides ==
               CompactStrides(std::vector<int64_t>(desc.shape().begin(), desc.shape().end())));
  }
  FUZZ_CHECK(layout->item_bytes == ItemBytes(desc.dtype()) && layout->item_bytes > 0 &&
             layout->item_bytes <= 16);

  Reference ref = Compute(desc, layout->item_bytes, layout->strides);
  FUZZ_CHECK(ref.fits) << "accepted a description whose sizes exceed " << kMaxTensorBytes;
  FUZZ_CHECK(ref.elements == layout->num_elements);
  FUZZ_CHECK(layout->nbytes == layout->num_elements * layout->item_bytes);
  FUZZ_CHECK(layout->nbytes <= kMaxTensorBytes);
  FUZZ_CHECK(ref.extent == layout->extent) << "extent " << layout->extent;
  FUZZ_CHECK(layout->extent <= kMaxTensorBytes);
  FUZZ_CHECK(layout->c_contiguous == ReferenceCContiguous(desc, layout->strides));
  CheckElementsInsideExtent(desc, *layout);
  CheckFitsBuffer(in, *layout);

  // The DLPack forms carry the same dtype and device.
  absl::StatusOr<tensord::v1::DataType> dtype = FromDLDataType(ToDLDataType(desc.dtype()));
  FUZZ_CHECK(dtype.ok() && dtype->code() == desc.dtype().code() &&
             dtype->bits() == desc.dtype().bits() && dtype->lanes() == 1)
      << dtype.status();
  absl::StatusOr<tensord::v1::Device> device = FromDLDevice(ToDLDevice(desc.device()));
  FUZZ_CHECK(device.ok() && device->type() == desc.device().type() &&
             device->index() == desc.device().index())
      << device.status();
  absl::StatusOr<tensord::v1::DataType> named = ParseDTypeName(DTypeName(desc.dtype()));
  FUZZ_CHECK(named.ok() && named->code() == desc.dtype().code() &&
             named->bits() == desc.dtype().bits());
}

// DLPack values from a foreign producer, and dtype names from a command line.
void CheckConversions(FuzzedDataProvider& in) {
  tensord::DLDataType dl{in.ConsumeIntegral<uint8_t>(), in.ConsumeIntegral<uint8_t>(),
                         in.ConsumeIntegral<uint16_t>()};
  absl::StatusOr<tensord::v1::DataType> dtype = FromDLDataType(dl);
  if (dtype.ok()) {
    FUZZ_CHECK(ItemBytes(*dtype) > 0);
    tensord::DLDataType back = ToDLDataType(*dtype);
    FUZZ_CHECK(back.code == dl.code && back.bits == dl.bits && back.lanes == dl.lanes);
  } else {
    FUZZ_CHECK(dtype.status().code() == absl::StatusCode::kInvalidArgument) << dtype.status();
  }
  tensord::DLDevice dev{in.ConsumeIntegral<int32_t>(), in.ConsumeIntegral<int32_t>()};
  absl::StatusOr<tensord::v1::Device> device = FromDLDevice(dev);
  FUZZ_CHECK(device.ok() || device.status().code() == absl::StatusCode::kInvalidArgument);
  std::string name = in.ConsumeRandomLengthString(80);
  absl::StatusOr<tensord::v1::DataType> parsed = ParseDTypeName(name);
  if (parsed.ok()) {
    FUZZ_CHECK(DTypeName(*parsed) == name) << name;
  } else {
    FUZZ_CHECK(fuzz::IsReadableMessage(parsed.status().message(), 512)) << parsed.status();
  }
}

}  // namespace
}  // namespace tensord::common

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Hostile bytes make protobuf log every invalid UTF-8 string it refuses: noise here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  tensord::v1::TensorDesc desc;
  if (in.ConsumeBool()) {
    // A serialized description, as the broker receives it.
    std::string bytes = in.ConsumeRandomLengthString(1024);
    if (!desc.ParseFromString(bytes)) return 0;
  } else {
    desc = tensord::common::BuildDesc(in);
  }
  tensord::common::CheckDesc(in, desc);
  tensord::common::CheckConversions(in);
  return 0;
}
