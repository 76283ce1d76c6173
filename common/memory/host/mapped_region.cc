#include "common/memory/host/mapped_region.h"

#include <sys/mman.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tensord::common {
namespace {

struct MapFlags {
  int prot;
  int flags;
  const char* name;
};

MapFlags FlagsFor(MapMode mode) {
  switch (mode) {
    case MapMode::kSharedWritable:
      return {PROT_READ | PROT_WRITE, MAP_SHARED, "shared writable"};
    case MapMode::kPrivate:
      return {PROT_READ | PROT_WRITE, MAP_PRIVATE, "private copy-on-write"};
    case MapMode::kSharedReadOnly:
      return {PROT_READ, MAP_SHARED, "shared read-only"};
  }
  return {PROT_READ, MAP_SHARED, "shared read-only"};  // unreachable: every mode handled
}

}  // namespace

absl::StatusOr<MappedRegion> MappedRegion::Map(int fd, uint64_t size, MapMode mode,
                                               const std::string& what) {
  MapFlags f = FlagsFor(mode);
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("mmap ", what, ": size 0 cannot be mapped (zero-byte tensors have no buffer)"));
  }
  if (size > static_cast<uint64_t>(SIZE_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("mmap ", what, ": ", size, " bytes is too large"));
  }
  void* addr = ::mmap(nullptr, static_cast<size_t>(size), f.prot, f.flags, fd, 0);
  if (addr == MAP_FAILED) {
    return ErrnoToStatus(absl::StrCat("mmap ", what, " (", size, " bytes, ", f.name, ")"), errno);
  }
  return MappedRegion(addr, size, mode);
}

MappedRegion::MappedRegion(MappedRegion&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mode_(other.mode_) {}

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    reset();
    addr_ = std::exchange(other.addr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mode_ = other.mode_;
  }
  return *this;
}

MappedRegion::~MappedRegion() { reset(); }

void MappedRegion::reset() {
  if (addr_ != nullptr) {
    // munmap of a range we mapped can only fail on a broken invariant; nothing to do then.
    ::munmap(addr_, static_cast<size_t>(size_));
  }
  addr_ = nullptr;
  size_ = 0;
}

}  // namespace tensord::common
