// MemoryBackend: one implementation per memory kind, chosen by the DLPack device type of a
// tensor description (host memfds; CUDA and Level Zero plug in here). The broker holds
// them in a BackendRegistry (server/memory/backend_registry.h) and never looks inside a buffer:
// everything that depends on the memory kind is a call on this seam.
//
// A backend allocates broker-owned buffers on one of its devices, or adopts memory a
// producer already has. A BackendBuffer owns its memory (RAII: the destructor frees it, and
// may block, so the broker destroys buffers off its RPC threads), exports the handle a
// reader imports, and says whether it may be shared with readers at all. Allocate and
// Adopt may block (a multi-GiB fallocate, a device allocation): the broker calls them off
// its RPC threads. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/memory/memory_handle.h"
#include "tensord/v1/tensor.pb.h"

namespace tensord::common {

// A device a backend serves, as the daemon sees it.
struct BackendDevice {
  tensord::v1::Device device;  // type, the daemon's ordinal, uuid (16 bytes; empty for host)
  std::string name;            // for display: "host memory", the driver's device name
  uint64_t total_bytes = 0;    // 0: not known
};

class BackendBuffer {
 public:
  virtual ~BackendBuffer() = default;
  // Bytes the buffer holds (rounded up to its backend's granularity): what quotas count.
  virtual uint64_t size() const = 0;
  // What a reader needs to import the buffer: the backend's handle bytes and dups of its
  // fds, which the caller sends and closes.
  virtual absl::StatusOr<MemoryHandle> Export() const = 0;
  // OK when readers may be given the handle: for host memory, the memfd carries the seals
  // that keep readers safe from the producer (kRequiredReaderSeals). The broker asks before
  // the first publish of a tensor in the buffer; FAILED_PRECONDITION naming `what` and the
  // reason otherwise.
  virtual absl::Status CheckShareable(const std::string& what) const = 0;
  // True when the memory is its producer's, not the buffer's (a legacy CUDA IPC export):
  // the buffer keeps nothing alive, so the memory can go when the producer's process exits,
  // and the broker must then retire every tensor in it. False for memory the buffer owns
  // (a memfd, a VMM allocation), which outlives its producer.
  virtual bool OwnedByProducer() const { return false; }
  // True when the memory may carry a later tensor of the same producer once its tensors are
  // gone (the broker's BufferPool): memory the broker made, which its producer keeps mapped
  // writable (a memfd, a CUDA VMM allocation). Device work needs no check here: a consumer
  // releases a lease only once the work it queued on the tensor has finished (its done
  // fences, stream_order.h), so a buffer whose last lease is gone is idle on every stream.
  // False for memory adopted from a producer.
  virtual bool Recyclable() const { return false; }
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  // "host", "cuda", "level_zero": in status output and errors.
  virtual std::string_view name() const = 0;
  virtual tensord::v1::DeviceType device_type() const = 0;
  // Why the backend cannot serve (no driver, no device); empty when it can. Cheap, and
  // fixed once the backend is made (it asks its driver once).
  virtual std::string unavailable_reason() const = 0;
  // The devices it serves now; empty when unavailable.
  virtual std::vector<BackendDevice> devices() const = 0;
  // The bytes a buffer of `size` takes on `device` (its allocation granularity).
  virtual uint64_t RoundUp(const BackendDevice& device, uint64_t size) const = 0;
  // A new buffer of `size` bytes (already rounded up) on `device`. RESOURCE_EXHAUSTED when
  // the device cannot back it.
  virtual absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(const BackendDevice& device, uint64_t size,
                                                                  const std::string& debug_name) = 0;
  // Memory a producer already has, as it sent it: host, one staged memfd in `handle.fds`;
  // cuda, an IPC handle in `handle.data` for an allocation of `size` bytes. The buffer
  // owns whatever it keeps of `handle`. FAILED_PRECONDITION / INVALID_ARGUMENT naming `what`
  // when the handle cannot be shared safely or is malformed.
  virtual absl::StatusOr<std::unique_ptr<BackendBuffer>> Adopt(const BackendDevice& device, MemoryHandle handle,
                                                               uint64_t size, const std::string& what) = 0;
  // A published buffer of `size` bytes that another daemon held, carried here as the
  // handle its Export gave (tensord --take-over). The buffer must be fit for readers as it
  // is (host: a memfd of that size with the reader seals). By default a backend's memory
  // cannot be carried: FAILED_PRECONDITION naming `what`, and the broker drops its tensors
  // saying why.
  // Whether Restore can take this backend's buffers: a snapshot leaves the others out, so
  // that no device memory is kept alive by a handle nobody can use.
  virtual bool Restorable() const { return false; }
  virtual absl::StatusOr<std::unique_ptr<BackendBuffer>> Restore(const BackendDevice& device, MemoryHandle handle,
                                                                 uint64_t size, const std::string& what) {
    (void)device, (void)handle, (void)size;
    return absl::FailedPreconditionError(what + ": " + std::string(name()) +
                                         " memory cannot be carried to a new daemon");
  }
};

}  // namespace tensord::common
