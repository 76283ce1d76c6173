// Tensor descriptions: validation and layout arithmetic, shared by the broker (which checks
// every request) and the client (which checks every description it gets back before it
// builds a DLTensor). Wire descriptions only: converting to and from DLPack's types is the
// client's (client/dlpack_convert.h). Pure functions; thread-safe.
//
// Errors: INVALID_ARGUMENT naming the field ("desc.shape[2] is -1: dimensions must be >= 0").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensord/v1/tensor.pb.h"

namespace tensord::common {

inline constexpr int kMaxNdim = 32;
// Bytes of one tensor's extent: large enough for anything a node holds, small enough
// that offset + extent arithmetic never overflows.
inline constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 50;

// What a valid description works out to.
struct TensorLayout {
  uint64_t item_bytes = 0;    // bytes per element
  uint64_t num_elements = 0;  // product of shape (0 when any dim is 0)
  uint64_t nbytes = 0;        // num_elements * item_bytes
  // Bytes from the start of the tensor's extent that any element reaches:
  // byte_offset + (max reachable element offset + 1) * item_bytes; 0 when num_elements
  // is 0. Negative strides are refused, so the lowest element is element 0.
  uint64_t extent = 0;
  std::vector<int64_t> strides;  // in elements, filled in (C order when none were given)
  // Strides equal CompactStrides, ignoring dims of size 1; true for an empty tensor.
  bool c_contiguous = false;
};

// Checks dtype (known code and width, lanes == 1), ndim <= kMaxNdim, non-negative dims and
// strides, strides count == ndim when given, overflow-free byte arithmetic up to
// kMaxTensorBytes, and a known device type.
absl::StatusOr<TensorLayout> ValidateDesc(const tensord::v1::TensorDesc& desc);

// Checks that every reachable element of `layout` lies inside `buffer` (offset + extent
// <= size, without overflow). A non-zero buffer.extent also bounds layout.extent and must
// itself fit the buffer; 0 means the buffer states none. Errors name the tensor by `what`.
absl::Status ValidateFitsBuffer(const TensorLayout& layout, const tensord::v1::BufferRef& buffer,
                                std::string_view what);

// Bytes per element of a valid dtype; 0 for an invalid one.
uint64_t ItemBytes(const tensord::v1::DataType& dtype);

// C-order strides (elements) for a shape.
std::vector<int64_t> CompactStrides(const std::vector<int64_t>& shape);

// The parts of ValidateDesc, for a dtype or device that comes alone (from DLPack, say).
// `field` names it in errors ("desc.dtype": "desc.dtype.bits is 12: INT allows ...").
// ValidateDType: a known code and width, lanes == 1. ValidateDevice: a known type, index
// >= 0 (0 for CPU), a uuid of 0 or 16 bytes.
absl::Status ValidateDType(const tensord::v1::DataType& dtype, std::string_view field);
absl::Status ValidateDevice(const tensord::v1::Device& device, std::string_view field);
// Whether tensord knows a DTypeCode / DeviceType value (whatever its width or index).
bool KnownDTypeCode(int code);
bool KnownDeviceType(int type);

// "float32", "int64", "bool", "bfloat16", "complex64", ...
std::string DTypeName(const tensord::v1::DataType& dtype);
// The inverse of DTypeName; INVALID_ARGUMENT for an unknown name.
absl::StatusOr<tensord::v1::DataType> ParseDTypeName(std::string_view name);

}  // namespace tensord::common
