// CudaHandle: the bytes of a CUDA buffer's MemoryHandle.data, as the cuda backend writes
// them and the cuda importer reads them. Versioned, fixed layout, little-endian:
//
//   offset  size  field
//   0       4     magic "TDCU"
//   4       2     version (1)
//   6       2     kind: 1 = VMM allocation exported as a POSIX fd (the fd travels beside
//                 the bytes), 2 = legacy CUDA IPC (no fd)
//   8       16    device UUID (raw bytes, as cuDeviceGetUuid gives them)
//   24      8     size: bytes of the allocation the handle names
//   -- kind 2 only --
//   32      8     offset: where the buffer starts within the allocation (the producer's
//                 pointer minus the allocation base from cuMemGetAddressRange)
//   40      64    CUipcMemHandle of the allocation base
//
// A VMM handle is 32 bytes, a legacy IPC handle 104. Decoding is strict: anything else is
// INVALID_ARGUMENT naming what is wrong. The bytes are a capability (legacy IPC ones in
// particular): never log them or put them in an error.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/protocol_limits.h"

namespace tensord::common {

enum class CudaHandleKind : uint16_t {
  kVmmFd = 1,
  kLegacyIpc = 2,
};

inline constexpr uint16_t kCudaHandleVersion = 1;
inline constexpr size_t kCudaUuidBytes = 16;
inline constexpr size_t kCudaIpcHandleBytes = 64;  // CU_IPC_HANDLE_SIZE
inline constexpr size_t kCudaVmmHandleBytes = 32;
inline constexpr size_t kCudaLegacyIpcHandleBytes = 104;

struct CudaHandle {
  CudaHandleKind kind = CudaHandleKind::kVmmFd;
  std::string uuid;    // 16 raw bytes
  uint64_t size = 0;   // bytes of the allocation
  uint64_t offset = 0; // legacy IPC: the buffer's start within the allocation; VMM: 0
  std::array<uint8_t, kCudaIpcHandleBytes> ipc_handle{};  // legacy IPC only
};

// The wire bytes of `handle`. `handle.uuid` must be 16 bytes (a broken invariant
// otherwise: CHECKed).
std::string EncodeCudaHandle(const CudaHandle& handle);

// Parses and checks `data`: magic, version, kind, the exact length for the kind, a
// non-zero size, and for legacy IPC an offset inside the allocation.
absl::StatusOr<CudaHandle> DecodeCudaHandle(std::string_view data);

// "VMM fd" or "legacy IPC", for messages.
const char* CudaHandleKindName(CudaHandleKind kind);

// CudaEventFence: the bytes of a "ready" fence (stream_order.h) on a CUDA device: an
// interprocess event the producer recorded at publish. Fixed layout, little-endian:
//
//   offset  size  field
//   0       4     magic "TDCE"
//   4       2     version (1)
//   6       2     reserved, 0
//   8       16    device UUID (raw bytes): the context the event is opened in
//   24      64    CUipcEventHandle
//
// 88 bytes. Like memory handles, the bytes are a capability: never logged.
inline constexpr size_t kCudaEventFenceBytes = 88;
static_assert(kCudaEventFenceBytes <= kMaxReadyFenceBytes, "the broker would refuse every CUDA publish");

struct CudaEventFence {
  std::string uuid;  // 16 raw bytes
  std::array<uint8_t, kCudaIpcHandleBytes> ipc_event{};
};

std::string EncodeCudaEventFence(const CudaEventFence& fence);
// Strict: magic, version, reserved 0 and the exact length; INVALID_ARGUMENT otherwise.
absl::StatusOr<CudaEventFence> DecodeCudaEventFence(std::string_view data);

}  // namespace tensord::common
