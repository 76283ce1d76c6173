// Conversions between DLPack's dtype and device (tensord::DLDataType, DLDevice: the public
// API's) and the wire's (tensord.v1.DataType, Device). Only the client converts: the daemon
// sees wire descriptions alone, which common/tensor_desc.h validates. Pure functions;
// thread-safe.
//
// Errors: INVALID_ARGUMENT naming the DLPack field ("dlpack dtype.code is 3: ...",
// "dlpack device.index is -1: must be >= 0").
#pragma once

#include "absl/status/statusor.h"
#include "tensord/dlpack.h"
#include "tensord/v1/tensor.pb.h"

namespace tensord::internal {

// Wire -> DLPack assumes a validated description (common::ValidateDesc). DLPack -> wire
// checks what it converts as ValidateDesc would (common::ValidateDType, ValidateDevice).
DLDataType ToDLDataType(const tensord::v1::DataType& dtype);
absl::StatusOr<tensord::v1::DataType> FromDLDataType(DLDataType dtype);
DLDevice ToDLDevice(const tensord::v1::Device& device);
absl::StatusOr<tensord::v1::Device> FromDLDevice(DLDevice device);

}  // namespace tensord::internal
