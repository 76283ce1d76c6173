#include "client/mapping_cache.h"

#include <string>

#include "common/memory/memfd.h"
#include "common/status.h"

namespace tensord::internal {
namespace {

constexpr int kSealShrink = 0x0002;  // F_SEAL_SHRINK

std::string Describe(const MappingKey& key) { return "buffer " + std::to_string(key.buffer_id); }

}  // namespace

std::shared_ptr<Mapping> MappingCache::Lookup(const MappingKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  std::shared_ptr<Mapping> live = it->second.lock();
  if (!live) entries_.erase(it);
  return live;
}

absl::StatusOr<std::shared_ptr<Mapping>> MappingCache::GetOrMap(const MappingKey& key,
                                                                const FetchFn& fetch,
                                                                const AfterMapFn& after_map) {
  {
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Mapping> hit = Lookup(key)) return hit;
  }
  fetches_.fetch_add(1, std::memory_order_relaxed);
  TENSORD_ASSIGN_OR_RETURN(BufferFd buffer, fetch());
  // The fd closes when `buffer` goes out of scope, right after mapping.
  return MapAndInsert(key, buffer.fd.get(), buffer.size, after_map);
}

absl::StatusOr<std::shared_ptr<Mapping>> MappingCache::GetOrMapFd(const MappingKey& key, int fd,
                                                                  uint64_t size,
                                                                  const AfterMapFn& after_map) {
  {
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Mapping> hit = Lookup(key)) return hit;
  }
  return MapAndInsert(key, fd, size, after_map);
}

absl::StatusOr<std::shared_ptr<Mapping>> MappingCache::MapAndInsert(const MappingKey& key, int fd,
                                                                    uint64_t size,
                                                                    const AfterMapFn& after_map) {
  const std::string what = Describe(key);
  if (size == 0) return absl::DataLossError(what + ": the broker sent a zero-size buffer");
  // Touching a mapping beyond the end of the file raises SIGBUS, and so would a buffer that
  // could shrink under us: check both before mapping.
  TENSORD_ASSIGN_OR_RETURN(uint64_t actual, common::FdSize(fd, what));
  if (actual < size) {
    return absl::DataLossError(what + ": the fd holds " + std::to_string(actual) +
                               " bytes, the broker says " + std::to_string(size));
  }
  TENSORD_ASSIGN_OR_RETURN(int seals, common::GetSeals(fd, what));
  if ((seals & kSealShrink) == 0) {
    return absl::FailedPreconditionError(what + ": the buffer is not sealed against shrinking");
  }
  TENSORD_ASSIGN_OR_RETURN(common::MappedRegion region,
                           common::MappedRegion::Map(fd, size, key.mode, what));
  if (after_map) TENSORD_RETURN_IF_ERROR(after_map(fd));
  auto mapping = std::make_shared<Mapping>(std::move(region));

  absl::MutexLock lock(&mu_);
  if (std::shared_ptr<Mapping> winner = Lookup(key)) return winner;  // ours is unmapped here
  entries_[key] = mapping;
  return mapping;
}

size_t MappingCache::LiveCountForTest() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (auto& [key, weak] : entries_) n += weak.expired() ? 0 : 1;
  return n;
}

}  // namespace tensord::internal
