// MappingCache: one mapping per (broker instance nonce, buffer id, map mode), shared by
// every LeaseView into that buffer, so a second acquire of a buffer (another tensor in the
// same arena, or the same tensor again) fetches no fd and maps nothing new.
//
// A Mapping is owned by shared_ptr: each LeaseView holds one, and the last one to go
// unmaps (in its destructor, on whatever thread drops it: the release sender normally, a
// deleter only once the sender is stopped). The cache itself holds weak_ptrs, so it never
// keeps memory mapped, and dropping a Mapping takes no lock (the DLPack deleter path must
// not block). Expired entries are swept on lookup.
//
// GetOrMap() on a miss calls `fetch` (which returns the buffer's fd, e.g. FETCH_FD on the
// fd channel), checks the fd's size and seals, maps it and closes the fd at once. Two
// concurrent misses may both fetch; the first to insert wins and the other's mapping is
// dropped. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/memory/mapped_region.h"
#include "common/unique_fd.h"

namespace tensord::internal {

class Mapping {
 public:
  explicit Mapping(common::MappedRegion region) : region_(std::move(region)) {}
  uint8_t* data() const { return region_.data(); }
  uint64_t size() const { return region_.size(); }
  common::MapMode mode() const { return region_.mode(); }

 private:
  common::MappedRegion region_;
};

struct MappingKey {
  std::string instance_nonce;
  uint64_t buffer_id = 0;
  common::MapMode mode = common::MapMode::kPrivate;
  bool operator<(const MappingKey& o) const {
    return std::tie(instance_nonce, buffer_id, mode) < std::tie(o.instance_nonce, o.buffer_id, o.mode);
  }
};

// The fd of a buffer and the size the broker says it has.
struct BufferFd {
  common::UniqueFd fd;
  uint64_t size = 0;
};

class MappingCache {
 public:
  using FetchFn = std::function<absl::StatusOr<BufferFd>()>;
  // `after_map` (may be empty) runs on the fd after mapping, before it is closed: the
  // producer seals F_SEAL_FUTURE_WRITE there.
  using AfterMapFn = std::function<absl::Status(int fd)>;

  absl::StatusOr<std::shared_ptr<Mapping>> GetOrMap(const MappingKey& key, const FetchFn& fetch,
                                                    const AfterMapFn& after_map = {});
  // Maps `fd` (which the caller keeps) under `key` unless a live mapping is there already.
  absl::StatusOr<std::shared_ptr<Mapping>> GetOrMapFd(const MappingKey& key, int fd, uint64_t size,
                                                      const AfterMapFn& after_map = {});

  // Live mappings now (expired entries are not counted).
  size_t LiveCountForTest();
  uint64_t fetches() const { return fetches_.load(); }

 private:
  std::shared_ptr<Mapping> Lookup(const MappingKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Mapping>> MapAndInsert(const MappingKey& key, int fd,
                                                        uint64_t size, const AfterMapFn& after_map);

  absl::Mutex mu_;
  std::map<MappingKey, std::weak_ptr<Mapping>> entries_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> fetches_{0};
};

}  // namespace tensord::internal
