// ZeBackend: the server half of the level_zero memory kind (DEVICE_TYPE_ONEAPI, DLPack's
// kDLOneAPI). Broker-owned buffers are device allocations (zeMemAllocDevice) in a context
// the daemon owns, one per driver; producer exports are adopted as the IPC handle of the
// producer's allocation with its fd.
//
// Every buffer also gets an IPC event pool of one host-visible event, made by the daemon:
// the tensor's "ready" event (ze_stream_order.h). The pool travels in the buffer's handle
// (ze_handle.h), so a fence needs no fd of its own and outlives its producer. (An event
// pool's IPC handle holds an fd of the process that made it, which the gRPC publish that
// carries a fence cannot pass; the buffer's fd channel can.)
//
// Devices: ZeLoader's, named by UUID with the daemon's ordinal in Device.index.
// Granularity: Level Zero has no allocation-granularity query; RoundUp uses 64 KiB, the
// page size of device allocations on Intel GPUs, so quotas count what the device spends.
//
// Errors: INVALID_ARGUMENT for a device this backend does not serve, a size not rounded up
// or a malformed handle; RESOURCE_EXHAUSTED when the device is out of memory; UNAVAILABLE
// when the loader is; the driver's result otherwise (ZeLoader::ZeStatus). Messages name the
// device (level_zero:N (uuid)), the debug name and the result.
//
// Thread-safe: immutable after construction (contexts are thread-safe per the spec).
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/memory/level_zero/ze_handle.h"
#include "common/memory/level_zero/ze_loader.h"
#include "common/memory/memory_backend.h"
#include "common/unique_fd.h"

namespace tensord::common {

inline constexpr uint64_t kZeAllocationGranularity = 64 * 1024;

// One Level Zero buffer the daemon holds: its own allocation (kind 1) or a producer's
// export (kind 2), and the ready-event pool it made for it. Owns dups of the memory's and
// the pool's fds (the driver keeps its own). The destructor destroys the pool and frees an
// own allocation; failures are logged, never thrown.
class ZeBuffer final : public BackendBuffer {
 public:
  struct Parts {
    const ZeLoader* loader = nullptr;
    ze_context_handle_t context = nullptr;
    void* allocation = nullptr;  // kind 1 only: zeMemFree'd here
    ze_ipc_mem_handle_t allocation_ipc{};  // kind 1: given back with zeMemPutIpcHandle where it exists
    UniqueFd memory_fd;
    ze_event_pool_handle_t pool = nullptr;
    UniqueFd pool_fd;
    ZeHandle handle;  // with has_event_pool set; fd fields zeroed
    uint64_t size = 0;
    std::string debug_name;
  };
  explicit ZeBuffer(Parts parts);
  ZeBuffer(const ZeBuffer&) = delete;
  ZeBuffer& operator=(const ZeBuffer&) = delete;
  ~ZeBuffer() override;

  uint64_t size() const override { return parts_.size; }
  // The handle bytes and dups (O_CLOEXEC) of the memory's and the pool's fds.
  absl::StatusOr<MemoryHandle> Export() const override;
  // Device memory gives readers no way to be hurt by the producer's mapping: OK.
  absl::Status CheckShareable(const std::string& what) const override;
  // A producer's export is its allocation: the tensor must go when the producer does.
  bool OwnedByProducer() const override { return parts_.allocation == nullptr; }

 private:
  Parts parts_;
};

class ZeBackend final : public MemoryBackend {
 public:
  // Uses the process's loader (ZeLoader::Get()). Never fails: an unavailable loader or a
  // context that cannot be made makes an unavailable backend.
  ZeBackend();
  explicit ZeBackend(const ZeLoader* loader);
  ~ZeBackend() override;

  std::string_view name() const override { return "level_zero"; }
  tensord::v1::DeviceType device_type() const override { return tensord::v1::DEVICE_TYPE_ONEAPI; }
  std::string unavailable_reason() const override { return unavailable_reason_; }
  std::vector<BackendDevice> devices() const override;
  // Up to kZeAllocationGranularity; 0 stays 0; UINT64_MAX on overflow or an unknown device.
  uint64_t RoundUp(const BackendDevice& device, uint64_t size) const override;
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(const BackendDevice& device, uint64_t size,
                                                          const std::string& debug_name) override;
  // `handle`: a kProducerExport ZeHandle on `device`, with the allocation's fd as its one
  // fd, holding `size` bytes from its offset. INVALID_ARGUMENT naming `what` otherwise.
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Adopt(const BackendDevice& device, MemoryHandle handle,
                                                       uint64_t size, const std::string& what) override;

 private:
  struct Device {
    BackendDevice info;
    const ZeDevice* ze = nullptr;
    ze_context_handle_t context = nullptr;
  };
  absl::StatusOr<const Device*> Find(const BackendDevice& device) const;
  // The buffer's ready-event pool, into `parts`.
  absl::Status MakeReadyPool(const Device& device, ZeBuffer::Parts& parts, const std::string& where) const;

  const ZeLoader* const loader_;
  std::string unavailable_reason_;
  std::vector<Device> devices_;
  std::vector<ze_context_handle_t> contexts_;  // one per driver, destroyed with the backend
};

}  // namespace tensord::common
