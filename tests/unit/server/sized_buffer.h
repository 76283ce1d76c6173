// SizedBuffer: broker memory that is only a size, for tests of the parts that keep and hand
// out buffers (the pool, placement) without ever looking inside one.
#pragma once

#include <cstdint>
#include <string>

#include "common/memory/memory_backend.h"

namespace tensord::server::testing {

class SizedBuffer final : public common::BackendBuffer {
 public:
  explicit SizedBuffer(uint64_t size) : size_(size) {}
  uint64_t size() const override { return size_; }
  absl::StatusOr<common::MemoryHandle> Export() const override { return common::MemoryHandle{}; }
  absl::Status CheckShareable(const std::string&) const override { return absl::OkStatus(); }
  bool Recyclable() const override { return true; }

 private:
  uint64_t size_;
};

}  // namespace tensord::server::testing
