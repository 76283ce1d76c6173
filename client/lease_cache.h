// LeaseCache: this client's record of the leases its session holds: an index of its
// LeaseViews, and the lease cache proper (DESIGN.md "Lease cache"). Not the broker's lease
// table (server/state/lease_table.h), which says who holds what across sessions.
//
//  - held: (tensor id, view kind) -> the view holding this session's lease on that tensor,
//    so a second acquire of a tensor we hold adds a reference instead of keeping a second
//    remote lease (one remote lease per tensor and client).
//  - by name: (name, view kind) -> the view acquired by that name, while no `retired` push,
//    cache reset, Delete or Take of the name has said the binding moved.
//  - idle: views whose last local reference went but whose lease is kept (the cache), each
//    with a linger deadline. The cache owns idle views; a hit revives one at refcount 1.
//
// Views that are alive (refcount > 0) are not owned here; a view at refcount zero that is
// not idle is on its way to the release sender, and a lookup may still revive it until the
// sender's Dispose() has settled it (see LeaseView). Functions that drop cached leases return the views they removed: the caller
// releases their leases and destroys them. Thread-safe (one mutex; never held across I/O).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/lease_view.h"

namespace tensord::internal {

class LeaseCache {
 public:
  using Clock = std::chrono::steady_clock;

  LeaseCache(bool cache_enabled, std::chrono::milliseconds linger)
      : cache_enabled_(cache_enabled), linger_(linger) {}
  ~LeaseCache() = default;
  LeaseCache(const LeaseCache&) = delete;
  LeaseCache& operator=(const LeaseCache&) = delete;

  // A cache hit for `name`: a referenced view whose binding is at least `min_generation`
  // and not known to have moved, or null.
  LeaseView* FindByName(std::string_view name, ViewKind kind, uint64_t min_generation);
  // A referenced view holding a lease on `tensor_id`, or null.
  LeaseView* FindByTensor(uint64_t tensor_id, ViewKind kind, std::string_view acquired_name);

  struct InsertResult {
    LeaseView* view = nullptr;            // the view to hand out (referenced)
    bool inserted = false;                // false: `view` is an existing one; discard yours
    std::vector<LeaseView*> to_release;   // idle views displaced from the name
  };
  // Indexes a new view (refcount 1). When another live view of the tensor won a race,
  // returns that one instead.
  InsertResult Insert(LeaseView* view);

  // The release sender's decision for a view it took off the release queue: revived
  // meanwhile (leave it), kept in the lease cache (now idle, owned here), or to release
  // (unindexed: the caller releases its lease and destroys it). `closing`: never cache.
  enum class Disposition { kRevived, kCached, kRelease };
  Disposition Dispose(LeaseView* view, Clock::time_point now, bool closing);

  // A `retired` push: every view of the tensor becomes uncacheable; idle ones are returned.
  std::vector<LeaseView*> OnRetired(uint64_t tensor_id);
  // A `cache_reset` push: all idle views are returned, nothing stays cacheable.
  std::vector<LeaseView*> DropAllCached();
  // This client deleted or took `name`.
  std::vector<LeaseView*> DropName(std::string_view name);
  // Idle views whose linger passed; `next` gets the earliest remaining deadline (max()).
  std::vector<LeaseView*> TakeExpired(Clock::time_point now, Clock::time_point* next);
  // Every idle view (shutdown).
  std::vector<LeaseView*> TakeAllIdle();

  size_t idle_count();
  size_t held_count();

 private:
  using HeldKey = std::pair<uint64_t, ViewKind>;
  using NameKey = std::pair<std::string, ViewKind>;
  // The lease-cache state of a view this cache indexes, under mu_. The only way to it.
  LeaseView::CacheState& CacheOf(LeaseView* view) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return view->cache_;
  }
  // Removes `view` from every index that points at it.
  void Unindex(LeaseView* view) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Revives an idle view or adds a reference to an indexed one (see LeaseView::Revive).
  bool Claim(LeaseView* view) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MakeUncacheable(LeaseView* view, std::vector<LeaseView*>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool cache_enabled_;
  const std::chrono::milliseconds linger_;
  absl::Mutex mu_;
  std::map<HeldKey, LeaseView*> held_ ABSL_GUARDED_BY(mu_);
  std::map<NameKey, LeaseView*> by_name_ ABSL_GUARDED_BY(mu_);
  std::set<LeaseView*> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::internal
