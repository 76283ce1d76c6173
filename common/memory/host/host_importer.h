// HostImporter: the client half of host memory. A buffer's handle is one memfd: it must
// hold at least the size the broker states and be sealed against shrinking (touching a
// mapping past the end of a file raises SIGBUS), and is mapped in the mode asked for. The
// producer's writable mapping (kSharedWritable) is followed at once by F_SEAL_FUTURE_WRITE,
// the seal that protects readers: after it the memfd can never be mapped writable again,
// while the mapping just made stays writable.
//
// A HostRegion owns its mapping (munmap on destruction, no lock taken). Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "common/memory/host/mapped_region.h"
#include "common/memory/importer.h"

namespace tensord::common {

class HostRegion final : public ImportedRegion {
 public:
  explicit HostRegion(MappedRegion region) : region_(std::move(region)) {}
  uint8_t* data() const override { return region_.data(); }
  uint64_t size() const override { return region_.size(); }
  MapMode mode() const override { return region_.mode(); }
  // Copy-on-write mappings only (MADV_DONTNEED). `offset` must be page-aligned (else
  // nothing happens); the last page is discarded whole, so the range must own it (an arena
  // slot is whole pages). Skipped when /proc/self/pagemap shows no private copy in the
  // range. Never blocks on a lock.
  absl::Status DiscardPrivatePages(uint64_t offset, uint64_t length) const override;

 private:
  MappedRegion region_;
};

class HostImporter final : public Importer {
 public:
  tensord::v1::DeviceType device_type() const override { return tensord::v1::DEVICE_TYPE_CPU; }
  absl::StatusOr<std::unique_ptr<ImportedRegion>> Import(const FetchedBuffer& buffer, MapMode mode,
                                                         const std::string& what) override;
  // UNIMPLEMENTED: host memory is shared as a memfd (the broker seals it; a bare pointer
  // cannot be), which Client::Export takes.
  absl::StatusOr<MemoryHandle> ExportExisting(const void* ptr, uint64_t bytes, const tensord::v1::Device& device,
                                              const std::string& what) const override;
};

}  // namespace tensord::common
