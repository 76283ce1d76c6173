#include "client/mapping_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "common/memory/memfd.h"
#include "common/status.h"

namespace tensord::internal {
namespace {

constexpr int kSealShrink = 0x0002;  // F_SEAL_SHRINK

std::string Describe(const MappingKey& key) { return "buffer " + std::to_string(key.buffer_id); }

// This process's /proc/self/pagemap, opened once per process: a forked child must not read
// its parent's, so the fd is kept with the pid that opened it. -1: not readable here.
int PagemapFd() {
  // (pid << 32) | (fd + 1); 0: not opened yet.
  static std::atomic<uint64_t> cached{0};
  const uint64_t pid = static_cast<uint32_t>(::getpid());
  uint64_t seen = cached.load(std::memory_order_acquire);
  for (;;) {
    if (seen != 0 && (seen >> 32) == pid) return static_cast<int>(seen & 0xffffffffu) - 1;
    const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    const uint64_t mine = (pid << 32) | static_cast<uint32_t>(fd + 1);
    if (cached.compare_exchange_strong(seen, mine, std::memory_order_acq_rel)) {
      // A parent's fd, inherited by this child: nobody here uses it (its pid differs).
      const int inherited = static_cast<int>(seen & 0xffffffffu) - 1;
      if (seen != 0 && inherited >= 0) ::close(inherited);
      return fd;
    }
    if (fd >= 0) ::close(fd);  // another thread installed one first; `seen` holds it now
  }
}

// Whether a page of [begin, end) (page-aligned) holds a private copy of this process's:
// written since it was mapped (present and anonymous) or such a page swapped out. Pages
// only read map the buffer's own pages and need no discard. nullopt: cannot tell.
std::optional<bool> HasPrivateCopies(const uint8_t* begin, const uint8_t* end, uint64_t page) {
  const int fd = PagemapFd();
  if (fd < 0) return std::nullopt;
  constexpr uint64_t kPresent = uint64_t{1} << 63;
  constexpr uint64_t kSwapped = uint64_t{1} << 62;
  constexpr uint64_t kFileOrShared = uint64_t{1} << 61;
  uint64_t entries[16];  // an arena slot is at most 16 pages in the pool; larger ones loop
  uint64_t first = reinterpret_cast<uintptr_t>(begin) / page;
  const uint64_t last = reinterpret_cast<uintptr_t>(end) / page;
  while (first < last) {
    const uint64_t n = std::min<uint64_t>(last - first, std::size(entries));
    const ssize_t want = static_cast<ssize_t>(n * sizeof(uint64_t));
    const off_t at = static_cast<off_t>(first * sizeof(uint64_t));
    if (::pread(fd, entries, static_cast<size_t>(want), at) != want) return std::nullopt;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t e = entries[i];
      if ((e & kSwapped) != 0 || ((e & kPresent) != 0 && (e & kFileOrShared) == 0)) return true;
    }
    first += n;
  }
  return false;
}

}  // namespace

absl::Status Mapping::DiscardPrivatePages(uint64_t offset, uint64_t length) const {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (mode() != common::MapMode::kPrivate || length == 0 || offset % page != 0 ||
      offset >= size()) {
    return absl::OkStatus();
  }
  const uint64_t end = std::min(size(), (offset + length + page - 1) / page * page);
  // Most readers never write: then there is nothing to discard, and skipping the madvise
  // spares a TLB shootdown of every CPU this process runs on and a page fault per page the
  // next time the slot is read.
  if (HasPrivateCopies(data() + offset, data() + end, page) == std::optional<bool>(false)) {
    return absl::OkStatus();
  }
  if (::madvise(data() + offset, end - offset, MADV_DONTNEED) != 0) {
    return common::ErrnoToStatus("discard private pages of a mapping", errno);
  }
  return absl::OkStatus();
}

std::shared_ptr<Mapping> MappingCache::Lookup(const MappingKey& key, Retention retention) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  Entry& entry = it->second;
  std::shared_ptr<Mapping> live = entry.kept != nullptr ? entry.kept : entry.weak.lock();
  if (!live) {
    entries_.erase(it);
    return nullptr;
  }
  entry.idle = false;  // in use again: a linger counts from the next sweep that finds it unused
  if (retention > entry.retention) {
    entry.retention = retention;
    entry.kept = live;
    if (retention == Retention::kLinger) lingering_.insert(key);
  }
  return live;
}

absl::StatusOr<std::shared_ptr<Mapping>> MappingCache::GetOrMap(const MappingKey& key,
                                                                const FetchFn& fetch,
                                                                const AfterMapFn& after_map,
                                                                Retention retention) {
  {
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Mapping> hit = Lookup(key, retention)) return hit;
  }
  fetches_.fetch_add(1, std::memory_order_relaxed);
  fetch_calls_.fetch_add(1, std::memory_order_relaxed);
  TENSORD_ASSIGN_OR_RETURN(BufferFd buffer, fetch());
  // The fd closes when `buffer` goes out of scope, right after mapping.
  return MapAndInsert(key, buffer.fd.get(), buffer.size, after_map, retention);
}

absl::StatusOr<std::shared_ptr<Mapping>> MappingCache::GetOrMapFd(const MappingKey& key, int fd,
                                                                  uint64_t size,
                                                                  const AfterMapFn& after_map,
                                                                  Retention retention) {
  {
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Mapping> hit = Lookup(key, retention)) return hit;
  }
  return MapAndInsert(key, fd, size, after_map, retention);
}

absl::StatusOr<std::vector<std::shared_ptr<Mapping>>> MappingCache::GetOrMapMany(
    std::span<const BufferToMap> buffers, const FetchManyFn& fetch, const AfterMapFn& after_map) {
  std::vector<std::shared_ptr<Mapping>> out(buffers.size());
  // Each key not mapped yet, once, in the order first seen, with every index asking for it.
  std::vector<const BufferToMap*> to_fetch;
  std::map<MappingKey, std::vector<size_t>> waiting;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (std::shared_ptr<Mapping> hit = Lookup(buffers[i].key, buffers[i].retention)) {
        out[i] = std::move(hit);
        continue;
      }
      std::vector<size_t>& indexes = waiting[buffers[i].key];
      if (indexes.empty()) to_fetch.push_back(&buffers[i]);
      indexes.push_back(i);
    }
  }
  if (to_fetch.empty()) return out;
  std::vector<uint64_t> ids;
  ids.reserve(to_fetch.size());
  for (const BufferToMap* buffer : to_fetch) ids.push_back(buffer->key.buffer_id);
  fetches_.fetch_add(ids.size(), std::memory_order_relaxed);
  fetch_calls_.fetch_add(1, std::memory_order_relaxed);
  TENSORD_ASSIGN_OR_RETURN(std::vector<BufferFd> fds, fetch(ids));
  if (fds.size() != ids.size()) {
    return absl::InternalError("fetch: asked for " + std::to_string(ids.size()) +
                               " buffers, got " + std::to_string(fds.size()));
  }
  // Every fd is mapped and closed at once. One that fails does not stop the others: a
  // producer's seal may already be on them, so their mappings must not be thrown away.
  absl::Status first_error;
  for (size_t k = 0; k < to_fetch.size(); ++k) {
    const BufferToMap& buffer = *to_fetch[k];
    absl::StatusOr<std::shared_ptr<Mapping>> winner =
        MapAndInsert(buffer.key, fds[k].fd.get(), fds[k].size, after_map, buffer.retention);
    fds[k].fd.reset();
    if (!winner.ok()) {
      if (first_error.ok()) first_error = winner.status();
      continue;
    }
    for (size_t i : waiting[buffer.key]) out[i] = *winner;
  }
  if (!first_error.ok()) return first_error;
  return out;
}

absl::StatusOr<std::shared_ptr<Mapping>> MappingCache::Map(const MappingKey& key, int fd,
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
  return std::make_shared<Mapping>(std::move(region));
}

std::shared_ptr<Mapping> MappingCache::Insert(const MappingKey& key,
                                              std::shared_ptr<Mapping> mapping,
                                              Retention retention) {
  // A loser's mapping is unmapped by the caller once it drops it, outside the lock.
  if (std::shared_ptr<Mapping> winner = Lookup(key, retention)) return winner;
  Entry& entry = entries_[key];
  entry.weak = mapping;
  entry.retention = retention;
  entry.kept = retention == Retention::kNone ? nullptr : mapping;
  entry.idle = false;
  if (retention == Retention::kLinger) lingering_.insert(key);
  return mapping;
}

absl::StatusOr<std::shared_ptr<Mapping>> MappingCache::MapAndInsert(const MappingKey& key, int fd,
                                                                    uint64_t size,
                                                                    const AfterMapFn& after_map,
                                                                    Retention retention) {
  // A producer's writable mapping of an arena can be made once only: the first one seals the
  // arena against new writable mappings, so a second thread's mmap would fail with EPERM.
  // Concurrent first uses take turns, and the later ones find the first one's mapping.
  std::optional<absl::MutexLock> one_at_a_time;
  if (retention == Retention::kSession) {
    one_at_a_time.emplace(&session_map_mu_);
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Mapping> hit = Lookup(key, retention)) return hit;
  }
  TENSORD_ASSIGN_OR_RETURN(std::shared_ptr<Mapping> mapping, Map(key, fd, size, after_map));
  absl::MutexLock lock(&mu_);
  return Insert(key, std::move(mapping), retention);
}

MappingCache::Clock::time_point MappingCache::Sweep(Clock::time_point now) {
  Clock::time_point next = Clock::time_point::max();
  std::vector<std::shared_ptr<Mapping>> dropped;  // unmapped after the lock is let go
  absl::MutexLock lock(&mu_);
  for (auto key = lingering_.begin(); key != lingering_.end();) {
    auto it = entries_.find(*key);
    if (it == entries_.end() || it->second.kept == nullptr ||
        it->second.retention != Retention::kLinger) {
      key = lingering_.erase(key);
      continue;
    }
    Entry& entry = it->second;
    // A count of one under mu_ is stable: a new user can only come through Lookup().
    if (entry.kept.use_count() > 1) {
      entry.idle = false;
      ++key;
      continue;
    }
    if (!entry.idle) {
      entry.idle = true;
      entry.idle_since = now;
    }
    if (now - entry.idle_since >= linger_) {
      dropped.push_back(std::move(entry.kept));
      entries_.erase(it);
      key = lingering_.erase(key);
      continue;
    }
    next = std::min(next, entry.idle_since + linger_);
    ++key;
  }
  if (now >= next_cleanup_) {
    next_cleanup_ = now + std::chrono::seconds(1);
    for (auto it = entries_.begin(); it != entries_.end();) {
      const bool expired = it->second.kept == nullptr && it->second.weak.expired();
      it = expired ? entries_.erase(it) : std::next(it);
    }
  }
  return next;  // `lock` goes before `dropped`: nothing is unmapped under mu_
}

void MappingCache::ReleaseKept() {
  std::vector<std::shared_ptr<Mapping>> dropped;
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : entries_) {
    if (entry.kept != nullptr) dropped.push_back(std::move(entry.kept));
    entry.retention = Retention::kNone;
    entry.idle = false;
  }
  lingering_.clear();
  // `dropped` is declared before the lock, so it unmaps after the lock is released.
}

size_t MappingCache::LiveCountForTest() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (auto& [key, entry] : entries_) n += (entry.kept != nullptr || !entry.weak.expired()) ? 1 : 0;
  return n;
}

size_t MappingCache::KeptCountForTest() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (auto& [key, entry] : entries_) n += entry.kept != nullptr ? 1 : 0;
  return n;
}

size_t MappingCache::EntryCountForTest() {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace tensord::internal
