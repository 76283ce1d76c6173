#include "client/mapping_cache.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "common/status.h"

namespace tensord::internal {
namespace {

std::string Describe(const MappingKey& key) { return "buffer " + std::to_string(key.buffer_id); }

}  // namespace

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
                                                                Retention retention) {
  {
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Mapping> hit = Lookup(key, retention)) return hit;
  }
  fetches_.fetch_add(1, std::memory_order_relaxed);
  fetch_calls_.fetch_add(1, std::memory_order_relaxed);
  TENSORD_ASSIGN_OR_RETURN(common::FetchedBuffer buffer, fetch());
  // The handle's fds close when `buffer` goes out of scope, right after mapping.
  return MapAndInsert(key, buffer, retention);
}

absl::StatusOr<std::shared_ptr<Mapping>> MappingCache::GetOrMapHandle(const MappingKey& key,
                                                                      const common::FetchedBuffer& buffer,
                                                                      Retention retention) {
  {
    absl::MutexLock lock(&mu_);
    if (std::shared_ptr<Mapping> hit = Lookup(key, retention)) return hit;
  }
  return MapAndInsert(key, buffer, retention);
}

absl::StatusOr<std::vector<std::shared_ptr<Mapping>>> MappingCache::GetOrMapMany(
    std::span<const BufferToMap> buffers, const FetchManyFn& fetch) {
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
  TENSORD_ASSIGN_OR_RETURN(std::vector<common::FetchedBuffer> fetched, fetch(ids));
  if (fetched.size() != ids.size()) {
    return absl::InternalError("fetch: asked for " + std::to_string(ids.size()) +
                               " buffers, got " + std::to_string(fetched.size()));
  }
  // Every handle is mapped and its fds closed at once. One that fails does not stop the
  // others: a producer's seal may already be on them, so their mappings must not be thrown
  // away.
  absl::Status first_error;
  for (size_t k = 0; k < to_fetch.size(); ++k) {
    const BufferToMap& buffer = *to_fetch[k];
    absl::StatusOr<std::shared_ptr<Mapping>> winner = MapAndInsert(buffer.key, fetched[k], buffer.retention);
    fetched[k].handle = common::MemoryHandle();
    if (!winner.ok()) {
      if (first_error.ok()) first_error = winner.status();
      continue;
    }
    for (size_t i : waiting[buffer.key]) out[i] = *winner;
  }
  if (!first_error.ok()) return first_error;
  return out;
}

absl::StatusOr<std::shared_ptr<Mapping>> MappingCache::Map(const MappingKey& key,
                                                           const common::FetchedBuffer& buffer) {
  const tensord::v1::DeviceType type =
      key.view != tensord::v1::DEVICE_TYPE_UNSPECIFIED ? key.view : buffer.device_type;
  TENSORD_ASSIGN_OR_RETURN(common::Importer * importer, importers_.For(type));
  TENSORD_ASSIGN_OR_RETURN(std::unique_ptr<common::ImportedRegion> region,
                           importer->Import(buffer, key.mode, Describe(key)));
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

absl::StatusOr<std::shared_ptr<Mapping>> MappingCache::MapAndInsert(const MappingKey& key,
                                                                    const common::FetchedBuffer& buffer,
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
  TENSORD_ASSIGN_OR_RETURN(std::shared_ptr<Mapping> mapping, Map(key, buffer));
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

size_t MappingCache::DropKept(uint64_t buffer_id) {
  std::vector<std::shared_ptr<Mapping>> dropped;  // declared first: unmapped after the lock goes
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->first.buffer_id != buffer_id || it->second.kept == nullptr) {
      ++it;
      continue;
    }
    dropped.push_back(std::move(it->second.kept));
    lingering_.erase(it->first);
    it = entries_.erase(it);
  }
  return dropped.size();
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
