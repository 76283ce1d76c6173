// MappedRegion: sole owner of one mmap'ed range; munmap on destruction. Move-only.
// Not thread-safe; the mapping's memory may of course be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tensord::common {

enum class MapMode {
  kSharedWritable,  // producer: MAP_SHARED, PROT_READ|PROT_WRITE (before FUTURE_WRITE seal)
  kPrivate,         // consumer default: MAP_PRIVATE, PROT_READ|PROT_WRITE, copy-on-write
  kSharedReadOnly,  // consumer readonly=true: MAP_SHARED, PROT_READ
};

class MappedRegion {
 public:
  MappedRegion() = default;
  // Maps `size` bytes of `fd` from offset 0. The fd may be closed right after.
  static absl::StatusOr<MappedRegion> Map(int fd, uint64_t size, MapMode mode,
                                          const std::string& what);
  MappedRegion(MappedRegion&& other) noexcept;
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion();

  uint8_t* data() const { return static_cast<uint8_t*>(addr_); }
  uint64_t size() const { return size_; }
  MapMode mode() const { return mode_; }
  bool valid() const { return addr_ != nullptr; }
  void reset();

 private:
  MappedRegion(void* addr, uint64_t size, MapMode mode) : addr_(addr), size_(size), mode_(mode) {}
  void* addr_ = nullptr;
  uint64_t size_ = 0;
  MapMode mode_ = MapMode::kPrivate;
};

}  // namespace tensord::common
