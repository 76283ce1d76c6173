// MemoryBackend: one implementation per memory kind (host memfds today; CUDA and Level Zero
// plug in here), chosen by the DLPack device type of a tensor description.
//
// A backend allocates broker-owned buffers; a BackendBuffer owns its memory (RAII) and can
// hand out an fd that readers map. Allocate may block (a multi-GiB fallocate): the broker
// calls it off its RPC threads. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tensord/v1/tensor.pb.h"

namespace tensord::common {

class BackendBuffer {
 public:
  virtual ~BackendBuffer() = default;
  virtual uint64_t size() const = 0;
  // The fd a client maps (host: the memfd itself). Owned by the buffer; callers dup or
  // send it, never close it.
  virtual int shareable_fd() const = 0;
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual tensord::v1::DeviceType device_type() const = 0;
  // Why the backend cannot serve (no driver, no device); empty when it can.
  virtual std::string unavailable_reason() const = 0;
  // RESOURCE_EXHAUSTED when the node cannot back `size` bytes.
  virtual absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(uint64_t size,
                                                                  const std::string& debug_name) = 0;
};

}  // namespace tensord::common
