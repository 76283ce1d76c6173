// MappingCache: one mapping per (broker instance nonce, buffer id, map mode, view kind),
// shared by every LeaseView into that buffer, so a second acquire of a buffer (another tensor in the
// same arena, or the same tensor again) fetches no fd and maps nothing new.
//
// A Mapping is owned by shared_ptr: each LeaseView holds one. How long the cache itself
// keeps a mapping depends on the buffer (Retention):
//  - kNone (a dedicated buffer): the cache holds only a weak_ptr, so the last LeaseView to
//    go unmaps (in its destructor, on whatever thread drops it: the release sender
//    normally, a deleter only once the sender is stopped); dropping a Mapping takes no lock
//    (the DLPack deleter path must not block).
//  - kSession (a producer's writable mapping of an arena): the cache holds a strong
//    reference for as long as it lives. Once the producer sealed the arena with
//    F_SEAL_FUTURE_WRITE it could never map it writable again, and later allocations land
//    in the same arena.
//  - kLinger (a reader's mapping of an arena): the cache holds a strong reference, and
//    Sweep() drops it once nobody else has used it for `linger`, so a stream of fresh small
//    tensors in one arena maps it once.
// A Session owns one cache, so every key also carries that session's broker instance: a
// reconnect to a restarted daemon gets a new Session and a new cache, and ReleaseKept()
// (or the destructor) drops what the old one kept; views keep their own references.
//
// GetOrMap() on a miss calls `fetch` (which returns the buffer's handle, e.g. FETCH_FD on
// the fd channel), has the importer of the buffer's device type map it (the host importer
// checks the memfd's size and seals; see common/memory/importer.h), and closes the handle's
// fds at once; a key that names a view kind (a pinned view) is mapped by that kind's
// importer instead. Keys and retention are the same for every device. GetOrMapMany() does the
// same for a batch, with one call of its fetch function for all the buffers not mapped yet. Two concurrent misses may
// both fetch; the first to insert wins and the other's mapping is dropped. Expired weak
// entries are swept on lookup and by Sweep(). Thread-safe; nothing is unmapped while the
// cache's mutex is held.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/memory/importer.h"

namespace tensord::internal {

// One imported buffer (a host mmap, a device mapping); unmapped when the last owner goes.
class Mapping {
 public:
  explicit Mapping(std::unique_ptr<common::ImportedRegion> region) : region_(std::move(region)) {}
  uint8_t* data() const { return region_->data(); }
  uint64_t size() const { return region_->size(); }
  common::MapMode mode() const { return region_->mode(); }
  // This process's ordinal of the buffer's device (DLDevice.device_id).
  int32_t device_ordinal() const { return region_->device_ordinal(); }
  // DEVICE_TYPE_CUDA_HOST for a pinned view; UNSPECIFIED: the buffer's own device type.
  tensord::v1::DeviceType view_device_type() const { return region_->view_device_type(); }
  // How work on the buffer is ordered between processes; null for host memory.
  const common::StreamOrder* stream_order() const { return region_->stream_order(); }
  // See ImportedRegion::DiscardPrivatePages: copy-on-write host mappings read the buffer's
  // contents again; other regions have nothing to discard.
  absl::Status DiscardPrivatePages(uint64_t offset, uint64_t length) const {
    return region_->DiscardPrivatePages(offset, length);
  }

 private:
  std::unique_ptr<common::ImportedRegion> region_;
};

struct MappingKey {
  std::string instance_nonce;
  uint64_t buffer_id = 0;
  common::MapMode mode = common::MapMode::kPrivate;
  // The kind of view, when it is not the buffer's own memory kind: DEVICE_TYPE_CUDA_HOST
  // is a pinned view of host memory, mapped by that type's importer. A pinned and an
  // unpinned view of one buffer are different regions. UNSPECIFIED: the buffer's own
  // device type's importer.
  tensord::v1::DeviceType view = tensord::v1::DEVICE_TYPE_UNSPECIFIED;
  bool operator<(const MappingKey& o) const {
    return std::tie(instance_nonce, buffer_id, mode, view) < std::tie(o.instance_nonce, o.buffer_id, o.mode, o.view);
  }
};

// How long the cache keeps a mapping of its own (see the header comment).
enum class Retention : uint8_t { kNone, kSession, kLinger };

// One buffer GetOrMapMany() should map.
struct BufferToMap {
  MappingKey key;
  Retention retention = Retention::kNone;
};

class MappingCache {
 public:
  using Clock = std::chrono::steady_clock;
  using FetchFn = std::function<absl::StatusOr<common::FetchedBuffer>()>;
  // The handles of `buffer_ids`, one each, in that order.
  using FetchManyFn = std::function<absl::StatusOr<std::vector<common::FetchedBuffer>>(
      std::span<const uint64_t> buffer_ids)>;

  // `importers` (which must outlive the cache) map what is fetched. `linger`: how long
  // Sweep() keeps an unused kLinger mapping.
  explicit MappingCache(const common::Importers& importers,
                        std::chrono::milliseconds linger = std::chrono::milliseconds(0))
      : importers_(importers), linger_(linger) {}
  ~MappingCache() = default;
  MappingCache(const MappingCache&) = delete;
  MappingCache& operator=(const MappingCache&) = delete;

  absl::StatusOr<std::shared_ptr<Mapping>> GetOrMap(const MappingKey& key, const FetchFn& fetch,
                                                    Retention retention = Retention::kNone);
  // Maps `buffer` (a handle the caller already has, e.g. the memfd it exported) under
  // `key` unless a live mapping is there already.
  absl::StatusOr<std::shared_ptr<Mapping>> GetOrMapHandle(const MappingKey& key,
                                                          const common::FetchedBuffer& buffer,
                                                          Retention retention = Retention::kNone);
  // One mapping per entry of `buffers`, in order (a key may repeat). The keys not mapped
  // yet are fetched with one call of `fetch`, each buffer id once. On any error nothing
  // this call mapped is kept, and the error names the buffer.
  absl::StatusOr<std::vector<std::shared_ptr<Mapping>>> GetOrMapMany(
      std::span<const BufferToMap> buffers, const FetchManyFn& fetch);

  // Drops each kLinger mapping that nobody but the cache has used for the linger (counted
  // from the first sweep that found it unused), and at most once a second forgets expired
  // entries. Costs O(kLinger mappings) otherwise. Returns when a sweep next has something
  // to drop (Clock::time_point::max(): nothing).
  Clock::time_point Sweep(Clock::time_point now);
  // Drops every reference the cache keeps of its own (kSession and kLinger alike).
  void ReleaseKept();
  // The broker freed buffer `buffer_id` (a recycled buffer it will not hand out again):
  // drops the references the cache keeps of it, of any mode or view kind, so its memory is
  // unmapped once the views still using it go. Returns how many it dropped.
  size_t DropKept(uint64_t buffer_id);

  // Live mappings now (expired entries are not counted).
  size_t LiveCountForTest();
  // Mappings the cache keeps a reference to of its own.
  size_t KeptCountForTest();
  // Entries, expired ones included.
  size_t EntryCountForTest();
  // Buffers fetched, and calls of a fetch function (a GetOrMapMany() with misses is one).
  uint64_t fetches() const { return fetches_.load(); }
  uint64_t fetch_calls() const { return fetch_calls_.load(); }

 private:
  struct Entry {
    std::weak_ptr<Mapping> weak;
    std::shared_ptr<Mapping> kept;  // null for kNone
    Retention retention = Retention::kNone;
    bool idle = false;  // kLinger: the last sweep found no user but the cache
    Clock::time_point idle_since{};
  };
  // The live mapping under `key`, or null. A hit asking for a longer retention than the
  // entry has upgrades it (a buffer's arena flag never changes, so this is for safety).
  std::shared_ptr<Mapping> Lookup(const MappingKey& key, Retention retention)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Imports `buffer` with its device's importer; does not insert.
  absl::StatusOr<std::shared_ptr<Mapping>> Map(const MappingKey& key, const common::FetchedBuffer& buffer);
  // Inserts `mapping` unless another one won meanwhile; returns the one to use.
  std::shared_ptr<Mapping> Insert(const MappingKey& key, std::shared_ptr<Mapping> mapping,
                                  Retention retention) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Mapping>> MapAndInsert(const MappingKey& key,
                                                        const common::FetchedBuffer& buffer,
                                                        Retention retention);

  const common::Importers& importers_;
  const std::chrono::milliseconds linger_;
  absl::Mutex session_map_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // see MapAndInsert
  absl::Mutex mu_;
  std::map<MappingKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // The keys of the entries a sweep may drop (kLinger with a kept reference).
  std::set<MappingKey> lingering_ ABSL_GUARDED_BY(mu_);
  Clock::time_point next_cleanup_ ABSL_GUARDED_BY(mu_){};
  std::atomic<uint64_t> fetches_{0};
  std::atomic<uint64_t> fetch_calls_{0};
};

}  // namespace tensord::internal
