// ZeHandle: the bytes of a Level Zero buffer's MemoryHandle.data, as the level_zero backend
// writes them and its importer reads them, and the ready fence's bytes. Versioned, fixed
// layout, little-endian.
//
// A Level Zero IPC handle (memory or event pool) holds a file descriptor of the exporting
// process: Intel's driver puts the dma-buf fd in the first bytes of ze_ipc_mem_handle_t /
// ze_ipc_event_pool_handle_t. An fd number means nothing in another process, so the fd
// travels on the fd channel beside the bytes, and the handle bytes carry 0 where it was;
// the importer writes the fd it received back in (IpcFd / SetIpcFd below, or the loader's
// fd helpers where it has them: ze_loader.h).
//
//   offset  size  field
//   0       4     magic "TDZE"
//   4       2     version (1)
//   6       2     kind: 1 = allocated by the daemon (zeMemAllocDevice), 2 = exported by a
//                 producer from memory it already has
//   8       16    device UUID (ze_device_properties_t::uuid)
//   24      8     size: bytes of the allocation the handle names
//   32      8     offset: where the buffer starts within the allocation (0 for kind 1)
//   40      64    ze_ipc_mem_handle_t of the allocation, fd field zeroed  -> fds[0]
//   104     4     flags: bit 0 = a ready-event pool follows
//   108     4     events in the pool (1 when present, else 0)
//   112     64    ze_ipc_event_pool_handle_t of the buffer's ready-event pool, fd field
//                 zeroed -> fds[1]; all zero without one
//
// 176 bytes. Decoding is strict: anything else is INVALID_ARGUMENT naming what is wrong.
// The bytes, with their fds, are a capability: never log them.
//
// ZeReadyFence (stream_order.h's ready fence on a Level Zero device): the event lives in
// the buffer's pool, which every process that imported the buffer has opened, so the fence
// names only the device and the event's index:
//   0 4 magic "TDZF"; 4 2 version (1); 6 2 reserved 0; 8 16 device UUID; 24 4 event index;
//   28 4 reserved 0. 32 bytes.
#pragma once

#include <level_zero/ze_api.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/protocol_limits.h"

namespace tensord::common {

enum class ZeHandleKind : uint16_t {
  kDaemonAllocation = 1,
  kProducerExport = 2,
};

inline constexpr uint16_t kZeHandleVersion = 1;
inline constexpr size_t kZeUuidBytes = 16;
inline constexpr size_t kZeHandleBytes = 176;
inline constexpr size_t kZeReadyFenceBytes = 32;
static_assert(kZeReadyFenceBytes <= kMaxReadyFenceBytes, "the broker would refuse every Level Zero publish");

struct ZeHandle {
  ZeHandleKind kind = ZeHandleKind::kDaemonAllocation;
  std::string uuid;     // 16 raw bytes
  uint64_t size = 0;    // bytes of the allocation
  uint64_t offset = 0;  // the buffer's start within it
  std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> memory{};  // fd field zeroed
  bool has_event_pool = false;
  uint32_t event_count = 0;
  std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> event_pool{};  // fd field zeroed
  // How many fds travel beside the bytes: the memory's, and the pool's when present.
  size_t fd_count() const { return has_event_pool ? 2 : 1; }
};

// The wire bytes of `handle` (uuid must be 16 bytes: CHECKed).
std::string EncodeZeHandle(const ZeHandle& handle);
// Parses and checks `data`: magic, version, kind, exact length, a non-zero size, an offset
// inside the allocation, flags and event count that agree.
absl::StatusOr<ZeHandle> DecodeZeHandle(std::string_view data);
const char* ZeHandleKindName(ZeHandleKind kind);

struct ZeReadyFence {
  std::string uuid;  // 16 raw bytes
  uint32_t event_index = 0;
};
std::string EncodeZeReadyFence(const ZeReadyFence& fence);
absl::StatusOr<ZeReadyFence> DecodeZeReadyFence(std::string_view data);

// The fd inside an IPC handle's bytes, where Intel's driver lays it out: the first 8 bytes,
// little-endian (the fd in the low 32 bits). For handles of the 1.4 API, which has no
// helper to ask the driver; ze_loader.h's optional helpers take precedence where present.
int IpcFd(const std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE>& bytes);
void SetIpcFd(std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE>& bytes, int fd);

}  // namespace tensord::common
