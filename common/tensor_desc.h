// Tensor descriptions: validation and layout arithmetic, shared by the broker (which checks
// every request) and the client (which checks every description it gets back before it
// builds a DLTensor). Pure functions; thread-safe.
//
// Errors: INVALID_ARGUMENT naming the field ("desc.shape[2] is -1: dimensions must be >= 0").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tensord/dlpack.h"
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

// Conversions between the proto and DLPack forms. The proto -> DLPack direction assumes a
// validated description.
tensord::DLDataType ToDLDataType(const tensord::v1::DataType& dtype);
absl::StatusOr<tensord::v1::DataType> FromDLDataType(tensord::DLDataType dtype);
tensord::DLDevice ToDLDevice(const tensord::v1::Device& device);
absl::StatusOr<tensord::v1::Device> FromDLDevice(tensord::DLDevice device);

// "float32", "int64", "bool", "bfloat16", "complex64", ...
std::string DTypeName(const tensord::v1::DataType& dtype);
// The inverse of DTypeName; INVALID_ARGUMENT for an unknown name.
absl::StatusOr<tensord::v1::DataType> ParseDTypeName(std::string_view name);

}  // namespace tensord::common
