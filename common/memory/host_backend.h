// HostBackend: host memory as sealed memfds (see memfd.h). HostBuffer owns the memfd.
// Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "common/memory/memory_backend.h"
#include "common/unique_fd.h"

namespace tensord::common {

class HostBuffer final : public BackendBuffer {
 public:
  HostBuffer(UniqueFd fd, uint64_t size) : fd_(std::move(fd)), size_(size) {}
  uint64_t size() const override { return size_; }
  int shareable_fd() const override { return fd_.get(); }

 private:
  UniqueFd fd_;
  uint64_t size_;
};

class HostBackend final : public MemoryBackend {
 public:
  tensord::v1::DeviceType device_type() const override { return tensord::v1::DEVICE_TYPE_CPU; }
  std::string unavailable_reason() const override { return ""; }
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(uint64_t size,
                                                          const std::string& debug_name) override;
};

}  // namespace tensord::common
