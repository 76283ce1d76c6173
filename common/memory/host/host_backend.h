// HostBackend: host memory (kDLCPU) as sealed memfds (see memfd.h). A HostBuffer owns its
// memfd; its handle is the memfd itself (no handle bytes), and it may be shared once the
// memfd carries the reader seals the producer adds after mapping it (kRequiredReaderSeals).
// A memfd the backend made may be recycled for its producer's next tensor; an adopted one
// (a producer's export) is the producer's to reuse. Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/memory/memory_backend.h"
#include "common/unique_fd.h"

namespace tensord::common {

class HostBuffer final : public BackendBuffer {
 public:
  HostBuffer(UniqueFd fd, uint64_t size, bool made_here)
      : fd_(std::move(fd)), size_(size), made_here_(made_here) {}
  uint64_t size() const override { return size_; }
  absl::StatusOr<MemoryHandle> Export() const override;
  absl::Status CheckShareable(const std::string& what) const override;
  bool Recyclable() const override { return made_here_; }

 private:
  UniqueFd fd_;
  uint64_t size_;
  bool made_here_;  // made by HostBackend::Allocate, not adopted
};

class HostBackend final : public MemoryBackend {
 public:
  std::string_view name() const override { return "host"; }
  tensord::v1::DeviceType device_type() const override { return tensord::v1::DEVICE_TYPE_CPU; }
  std::string unavailable_reason() const override { return ""; }
  // One device: host memory (index 0, no UUID).
  std::vector<BackendDevice> devices() const override;
  // Whole pages: a mapping covers whole pages, and quotas count what the node backs.
  uint64_t RoundUp(const BackendDevice& device, uint64_t size) const override;
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(const BackendDevice& device, uint64_t size,
                                                          const std::string& debug_name) override;
  bool Restorable() const override { return true; }
  // The memfd, checked: its size is `size` and it carries the reader seals.
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Restore(const BackendDevice& device, MemoryHandle handle,
                                                         uint64_t size, const std::string& what) override;
  // `handle.fds` holds one staged memfd and no data; it is sealed against shrinking and
  // growing here. `size` is ignored: the buffer's size is the memfd's own.
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Adopt(const BackendDevice& device, MemoryHandle handle,
                                                       uint64_t size, const std::string& what) override;
};

}  // namespace tensord::common
