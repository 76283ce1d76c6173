// DLPack structs under tensord's own names (namespace tensord), laid out exactly as DLPack
// 1.x defines them, so this header never collides with any other dlpack.h a program
// includes. A `tensord::DLManagedTensor*` may be reinterpret_cast to `::DLManagedTensor*`
// (and the versioned one likewise): the static_asserts below pin the layout, and a unit
// test compares it with the system's dlpack.h.
//
// Debian's dlpack 0.6 lacks the versioned structs, kDLBool and kDLOneAPI; they are here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tensord {

inline constexpr uint32_t kDLPackMajorVersion = 1;
inline constexpr uint32_t kDLPackMinorVersion = 0;

enum DLDeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
};

enum DLDataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
};

struct DLDevice {
  int32_t device_type;  // a DLDeviceType
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;  // a DLDataTypeCode
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; never null in tensors tensord hands out
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

inline constexpr uint64_t kDLFlagBitMaskReadOnly = 1ULL << 0;
inline constexpr uint64_t kDLFlagBitMaskIsCopied = 1ULL << 1;

struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

static_assert(sizeof(DLDevice) == 8 && alignof(DLDevice) == 4);
static_assert(sizeof(DLDataType) == 4);
static_assert(offsetof(DLDataType, lanes) == 2);
static_assert(sizeof(DLTensor) == 48);
static_assert(offsetof(DLTensor, device) == 8 && offsetof(DLTensor, ndim) == 16 &&
              offsetof(DLTensor, dtype) == 20 && offsetof(DLTensor, shape) == 24 &&
              offsetof(DLTensor, strides) == 32 && offsetof(DLTensor, byte_offset) == 40);
static_assert(sizeof(DLManagedTensor) == 64);
static_assert(offsetof(DLManagedTensor, manager_ctx) == 48 &&
              offsetof(DLManagedTensor, deleter) == 56);
static_assert(sizeof(DLManagedTensorVersioned) == 80);
static_assert(offsetof(DLManagedTensorVersioned, manager_ctx) == 8 &&
              offsetof(DLManagedTensorVersioned, deleter) == 16 &&
              offsetof(DLManagedTensorVersioned, flags) == 24 &&
              offsetof(DLManagedTensorVersioned, dl_tensor) == 32);

}  // namespace tensord
