#include "common/tensor_desc.h"

#include <array>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/memory/memory_kinds.h"
#include "common/status.h"

namespace tensord::common {
namespace {

using tensord::v1::DataType;
using tensord::v1::Device;
using tensord::v1::TensorDesc;

// One row per supported (code, bits) pair; the name is what DTypeName prints. Every other
// table-driven answer (ItemBytes, ParseDTypeName) reads this table, so a dtype is added in
// one place.
struct DTypeEntry {
  tensord::v1::DTypeCode code;
  uint32_t bits;
  absl::string_view name;
};

constexpr std::array<DTypeEntry, 15> kDTypes = {{
    {tensord::v1::DTYPE_CODE_BOOL, 8, "bool"},
    {tensord::v1::DTYPE_CODE_INT, 8, "int8"},
    {tensord::v1::DTYPE_CODE_INT, 16, "int16"},
    {tensord::v1::DTYPE_CODE_INT, 32, "int32"},
    {tensord::v1::DTYPE_CODE_INT, 64, "int64"},
    {tensord::v1::DTYPE_CODE_UINT, 8, "uint8"},
    {tensord::v1::DTYPE_CODE_UINT, 16, "uint16"},
    {tensord::v1::DTYPE_CODE_UINT, 32, "uint32"},
    {tensord::v1::DTYPE_CODE_UINT, 64, "uint64"},
    {tensord::v1::DTYPE_CODE_FLOAT, 16, "float16"},
    {tensord::v1::DTYPE_CODE_FLOAT, 32, "float32"},
    {tensord::v1::DTYPE_CODE_FLOAT, 64, "float64"},
    {tensord::v1::DTYPE_CODE_BFLOAT, 16, "bfloat16"},
    {tensord::v1::DTYPE_CODE_COMPLEX, 64, "complex64"},
    {tensord::v1::DTYPE_CODE_COMPLEX, 128, "complex128"},
}};

const DTypeEntry* FindDType(int code, uint32_t bits) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.code == code && e.bits == bits) return &e;
  }
  return nullptr;
}

// The widths a code allows, for error messages.
absl::string_view AllowedBits(int code) {
  switch (code) {
    case tensord::v1::DTYPE_CODE_INT:
    case tensord::v1::DTYPE_CODE_UINT:
      return "8, 16, 32 or 64";
    case tensord::v1::DTYPE_CODE_FLOAT:
      return "16, 32 or 64";
    case tensord::v1::DTYPE_CODE_BFLOAT:
      return "16";
    case tensord::v1::DTYPE_CODE_COMPLEX:
      return "64 or 128";
    case tensord::v1::DTYPE_CODE_BOOL:
      return "8";
    default:
      return "";
  }
}

}  // namespace

bool KnownDTypeCode(int code) { return !AllowedBits(code).empty(); }

absl::Status ValidateDType(const DataType& dtype, std::string_view field) {
  if (!KnownDTypeCode(dtype.code())) {
    return absl::InvalidArgumentError(absl::StrCat(
        AbslView(field), ".code is ", dtype.code(),
        ": expected a known type code (int, uint, float, bfloat, complex or bool)"));
  }
  if (FindDType(dtype.code(), dtype.bits()) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(field), ".bits is ", dtype.bits(), ": ",
                     tensord::v1::DTypeCode_Name(dtype.code()), " allows ",
                     AllowedBits(dtype.code())));
  }
  if (dtype.lanes() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        AbslView(field), ".lanes is ", dtype.lanes(), ": must be 1 (vector types are not supported)"));
  }
  return absl::OkStatus();
}

bool KnownDeviceType(int type) { return FindMemoryKind(type) != nullptr; }

absl::Status ValidateDevice(const Device& device, std::string_view field) {
  const MemoryKind* kind = FindMemoryKind(device.type());
  if (kind == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(field), ".type is ", device.type(), ": expected ", KnownDeviceTypeNames()));
  }
  if (device.index() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(field), ".index is ", device.index(), ": must be >= 0"));
  }
  if (!kind->numbered && device.index() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(field), ".index is ", device.index(),
                                                   ": must be 0 for a ", WireTypeName(kind->type), " device"));
  }
  if (!device.uuid().empty() && device.uuid().size() != 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        AbslView(field), ".uuid has ", device.uuid().size(), " bytes: must be empty or 16 bytes"));
  }
  return absl::OkStatus();
}

namespace {

// a * b, or false when it overflows or exceeds kMaxTensorBytes.
bool MulBounded(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out) && *out <= kMaxTensorBytes;
}
bool AddBounded(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out) && *out <= kMaxTensorBytes;
}

std::string ShapeString(const TensorDesc& desc) {
  std::string s = "[";
  for (int i = 0; i < desc.shape_size(); ++i) {
    absl::StrAppend(&s, i == 0 ? "" : ", ", desc.shape(i));
  }
  return s + "]";
}

absl::Status ValidateShape(const TensorDesc& desc) {
  if (desc.shape_size() > kMaxNdim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "desc.shape has ", desc.shape_size(), " dimensions: at most ", kMaxNdim, " are supported"));
  }
  for (int i = 0; i < desc.shape_size(); ++i) {
    if (desc.shape(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("desc.shape[", i, "] is ", desc.shape(i),
                                                     ": dimensions must be >= 0"));
    }
  }
  if (desc.strides_size() != 0 && desc.strides_size() != desc.shape_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("desc.strides has ", desc.strides_size(), " entries for ",
                     desc.shape_size(), " dimensions: give none (C order) or one per dimension"));
  }
  for (int i = 0; i < desc.strides_size(); ++i) {
    if (desc.strides(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("desc.strides[", i, "] is ",
                                                     desc.strides(i), ": strides must be >= 0"));
    }
  }
  return absl::OkStatus();
}

// Element count and byte size. Zero dims are skipped in the bound check, so that a shape
// like [0, 2^40, 2^40] is refused too: its compact strides would overflow.
absl::Status ComputeSizes(const TensorDesc& desc, TensorLayout* layout) {
  uint64_t nonzero_product = 1;
  bool any_zero = false;
  for (int i = 0; i < desc.shape_size(); ++i) {
    uint64_t dim = static_cast<uint64_t>(desc.shape(i));
    if (dim == 0) {
      any_zero = true;
      continue;
    }
    uint64_t bytes = 0;
    if (!MulBounded(nonzero_product, dim, &nonzero_product) ||
        !MulBounded(nonzero_product, layout->item_bytes, &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("desc.shape ", ShapeString(desc),
                                                     " is too large: more than ",
                                                     kMaxTensorBytes, " bytes"));
    }
  }
  layout->num_elements = any_zero ? 0 : nonzero_product;
  layout->nbytes = layout->num_elements * layout->item_bytes;  // bounded above
  return absl::OkStatus();
}

// The extent: byte_offset + (largest reachable element offset + 1) * item_bytes.
absl::Status ComputeExtent(const TensorDesc& desc, TensorLayout* layout) {
  if (desc.byte_offset() > kMaxTensorBytes) {
    return absl::InvalidArgumentError(absl::StrCat("desc.byte_offset is ", desc.byte_offset(),
                                                   ": at most ", kMaxTensorBytes));
  }
  if (layout->num_elements == 0) {
    layout->extent = 0;
    return absl::OkStatus();
  }
  uint64_t max_offset = 0;  // elements
  for (size_t i = 0; i < layout->strides.size(); ++i) {
    uint64_t last = static_cast<uint64_t>(desc.shape(static_cast<int>(i))) - 1;
    uint64_t reach = 0;
    if (!MulBounded(last, static_cast<uint64_t>(layout->strides[i]), &reach) ||
        !AddBounded(max_offset, reach, &max_offset)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "desc.strides[", i, "] is ", layout->strides[i], ": with desc.shape[", i, "] = ",
          desc.shape(static_cast<int>(i)), " the tensor reaches past ", kMaxTensorBytes,
          " bytes"));
    }
  }
  uint64_t reach_bytes = 0;
  if (!MulBounded(max_offset + 1, layout->item_bytes, &reach_bytes) ||
      !AddBounded(desc.byte_offset(), reach_bytes, &layout->extent)) {
    return absl::InvalidArgumentError(absl::StrCat("desc: byte_offset ", desc.byte_offset(),
                                                   " plus the strided extent exceeds ",
                                                   kMaxTensorBytes, " bytes"));
  }
  return absl::OkStatus();
}

bool IsCContiguous(const TensorDesc& desc, const TensorLayout& layout) {
  // No element can be out of place in an empty tensor (numpy agrees).
  if (layout.num_elements == 0) return true;
  std::vector<int64_t> shape(desc.shape().begin(), desc.shape().end());
  std::vector<int64_t> compact = CompactStrides(shape);
  for (size_t i = 0; i < shape.size(); ++i) {
    // A dimension of size 1 is never stepped along, so its stride is irrelevant.
    if (shape[i] != 1 && layout.strides[i] != compact[i]) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<TensorLayout> ValidateDesc(const TensorDesc& desc) {
  TENSORD_RETURN_IF_ERROR(ValidateDType(desc.dtype(), "desc.dtype"));
  TENSORD_RETURN_IF_ERROR(ValidateShape(desc));
  TENSORD_RETURN_IF_ERROR(ValidateDevice(desc.device(), "desc.device"));

  TensorLayout layout;
  layout.item_bytes = ItemBytes(desc.dtype());
  TENSORD_RETURN_IF_ERROR(ComputeSizes(desc, &layout));
  if (desc.strides_size() == 0) {
    layout.strides = CompactStrides(std::vector<int64_t>(desc.shape().begin(), desc.shape().end()));
  } else {
    layout.strides.assign(desc.strides().begin(), desc.strides().end());
  }
  TENSORD_RETURN_IF_ERROR(ComputeExtent(desc, &layout));
  layout.c_contiguous = IsCContiguous(desc, layout);
  return layout;
}

absl::Status ValidateFitsBuffer(const TensorLayout& layout, const tensord::v1::BufferRef& buffer,
                                std::string_view what) {
  uint64_t end = 0;
  if (__builtin_add_overflow(buffer.offset(), layout.extent, &end) || end > buffer.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(what), ": extent of ", layout.extent, " bytes at offset ", buffer.offset(),
                     " does not fit buffer ", buffer.buffer_id(), " of ", buffer.size(), " bytes"));
  }
  // A stated buffer extent bounds what the tensor may reach (0 means not stated).
  if (buffer.extent() != 0) {
    uint64_t stated_end = 0;
    if (layout.extent > buffer.extent() ||
        __builtin_add_overflow(buffer.offset(), buffer.extent(), &stated_end) ||
        stated_end > buffer.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          AbslView(what), ": extent of ", layout.extent, " bytes does not fit the stated extent of ",
          buffer.extent(), " bytes at offset ", buffer.offset(), " in buffer ",
          buffer.buffer_id(), " of ", buffer.size(), " bytes"));
    }
  }
  return absl::OkStatus();
}

uint64_t ItemBytes(const DataType& dtype) {
  if (dtype.lanes() != 1) return 0;
  const DTypeEntry* e = FindDType(dtype.code(), dtype.bits());
  return e == nullptr ? 0 : e->bits / 8;
}

std::vector<int64_t> CompactStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    // Zero dims multiply as 1 (numpy and torch agree); saturate rather than overflow on
    // shapes ValidateDesc would refuse.
    int64_t dim = shape[i] > 1 ? shape[i] : 1;
    if (__builtin_mul_overflow(step, dim, &step)) step = INT64_MAX;
  }
  return strides;
}

std::string DTypeName(const DataType& dtype) {
  const DTypeEntry* e = dtype.lanes() == 1 ? FindDType(dtype.code(), dtype.bits()) : nullptr;
  if (e != nullptr) return std::string(e->name);
  return absl::StrCat("invalid(code=", dtype.code(), ", bits=", dtype.bits(),
                      ", lanes=", dtype.lanes(), ")");
}

absl::StatusOr<DataType> ParseDTypeName(std::string_view name) {
  auto make = [](const DTypeEntry& e) {
    DataType out;
    out.set_code(e.code);
    out.set_bits(e.bits);
    out.set_lanes(1);
    return out;
  };
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == AbslView(name)) return make(e);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype '", absl::CHexEscape(AbslView(name.substr(0, 64))), "' is unknown: expected bool, int8, int16, int32, int64, "
      "uint8, uint16, uint32, uint64, float16, float32, float64, bfloat16, complex64 or "
      "complex128"));
}

}  // namespace tensord::common
