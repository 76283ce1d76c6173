#include "client/dlpack_convert.h"

#include "absl/strings/str_cat.h"
#include "common/memory/memory_kinds.h"
#include "common/status.h"
#include "common/tensor_desc.h"

namespace tensord::internal {

using tensord::v1::DataType;
using tensord::v1::Device;

DLDataType ToDLDataType(const DataType& dtype) {
  return DLDataType{static_cast<uint8_t>(dtype.code() - 1), static_cast<uint8_t>(dtype.bits()),
                    static_cast<uint16_t>(dtype.lanes())};
}

absl::StatusOr<DataType> FromDLDataType(DLDataType dtype) {
  DataType out;
  // DLPack codes are the proto's minus one; an unknown code stays unknown after the shift.
  out.set_code(static_cast<tensord::v1::DTypeCode>(dtype.code + 1));
  out.set_bits(dtype.bits);
  out.set_lanes(dtype.lanes);
  if (!common::KnownDTypeCode(dtype.code + 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dlpack dtype.code is ", dtype.code, ": tensord supports int, uint, float, bfloat, "
        "complex and bool"));
  }
  TENSORD_RETURN_IF_ERROR(common::ValidateDType(out, "dlpack dtype"));
  return out;
}

DLDevice ToDLDevice(const Device& device) {
  return DLDevice{static_cast<int32_t>(device.type()), device.index()};
}

absl::StatusOr<Device> FromDLDevice(DLDevice device) {
  if (!common::KnownDeviceType(device.device_type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dlpack device_type is ", device.device_type,
                     ": tensord supports ", common::KnownDeviceTypeNames()));
  }
  Device out;
  out.set_type(static_cast<tensord::v1::DeviceType>(device.device_type));
  out.set_index(device.device_id);
  TENSORD_RETURN_IF_ERROR(common::ValidateDevice(out, "dlpack device"));
  return out;
}

}  // namespace tensord::internal
