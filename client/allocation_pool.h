// AllocationPool: a Session's arena slots allocated ahead of time, so that a small Allocate
// in the steady state needs no round trip to the broker (only its Publish does).
//
// An entry is a broker tensor allocated as a plain uint8 vector of exactly its class's
// bytes in one namespace: its producer lease and the broker's TensorInfo, not adopted as a
// LeaseView yet. The Session hands one out with the caller's description put in locally;
// Publish then sends that description (PublishRequest.desc), which the broker checks
// against the slot. Entries are keyed by (namespace, slot class); a class is a power-of-two
// number of pages, 1 to 16 (64 KiB with 4 KiB pages).
//
// The pool only decides and keeps; the Session makes every broker call, never under the
// pool's mutex. A class is pooled once a plain Allocate of it succeeded (so a namespace we
// may not write never costs a refill), and refills double per class up to
// min(kMaxRefill, kMaxRefillBytes / class bytes). When the broker puts an entry outside an
// arena (arenas off, or too small for the class) the class is never pooled again.
//
// Ownership: entries hold broker leases of the Session's broker session. They are never
// released from here: the Session gives back what Refill() refuses, and whatever is left
// goes with the session (closing the fd channel releases every lease); a forked child, which
// leaks the parent's Session, never touches them. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tensord/client.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::internal {

class AllocationPool {
 public:
  static constexpr uint64_t kMaxClassBytes = 64 << 10;
  static constexpr size_t kFirstRefill = 2;
  static constexpr size_t kMaxRefill = 64;
  static constexpr uint64_t kMaxRefillBytes = 256 << 10;

  struct Entry {
    uint64_t lease_id = 0;
    tensord::v1::TensorInfo tensor;  // as the broker sent it: uint8[class bytes]
  };

  // The slot class (bytes) for allocating `spec`, whose byte extent is `extent`, in `ns`;
  // 0 when it is never pooled (no namespace, isolated, tags, not host memory, no bytes,
  // or more than kMaxClassBytes).
  static uint64_t ClassBytes(std::string_view ns, const TensorSpec& spec, uint64_t extent);

  // What an Allocate of a class does now: hand out `entry`, or else refill `refill`
  // entries, or else (both empty) a plain Allocate.
  struct Next {
    std::optional<Entry> entry;
    size_t refill = 0;
  };
  Next Take(std::string_view ns, uint64_t class_bytes);
  // A plain Allocate of the class succeeded: the next ones may come from the pool.
  void NoteAllocated(std::string_view ns, uint64_t class_bytes);
  // What a refill was granted. Returns one entry for the caller and keeps the rest; when
  // any is not in an arena, the class is not pooled any more and nothing is kept. Lease
  // ids the Session must release are appended to `release`.
  std::optional<Entry> Refill(std::string_view ns, uint64_t class_bytes,
                              std::vector<Entry> granted, std::vector<uint64_t>& release);
  // Removes every entry of namespace `ns` (all classes) and returns their lease ids, for
  // the Session to release: idle slots must never be why an allocation runs out of room.
  std::vector<uint64_t> TakeAll(std::string_view ns);

 private:
  struct Class {
    bool seen = false;     // a plain Allocate of it succeeded
    bool pooled = true;    // false once the broker put an entry outside an arena
    size_t next_refill = kFirstRefill;
    std::vector<Entry> entries;
  };
  using Key = std::pair<std::string, uint64_t>;  // namespace, class bytes

  mutable absl::Mutex mu_;
  std::map<Key, Class> classes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::internal
