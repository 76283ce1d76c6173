// RecycledBuffers: a Session's writable mappings of its recyclable buffers, kept after the
// tensors in them are gone so the broker can hand the memory back to a later Allocate.
//
// The broker recycles a buffer only into an Allocate that names it (reuse_buffer_ids), and
// the Session names only buffers this table holds: whatever the table forgets, the broker
// never hands out again, so the producer always has the writable mapping of what it gets
// (after its F_SEAL_FUTURE_WRITE it could not map the buffer writable again). Entries are
// added when the broker grants a recyclable buffer (AllocateResponse.recyclable) and dropped
// when it pushes RecycledBufferFreed, or all at once after a cache_reset (pushes may have
// been lost) and with the Session. A buffer of a namespace is offered only for allocations
// in that namespace, as the broker requires.
//
// Candidates() hands out references to the mappings along with the ids, so an entry dropped
// while an Allocate naming it is in flight stays mapped until the answer is adopted.
// Thread-safe; mappings are unmapped outside the mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/mapping_cache.h"

namespace tensord::internal {

class RecycledBuffers {
 public:
  // At most this many ids go with one Allocate (the broker's pool is smaller by default).
  static constexpr size_t kMaxCandidates = 64;

  struct Candidates {
    std::vector<uint64_t> buffer_ids;
    std::vector<std::shared_ptr<Mapping>> held;  // keeps them mapped until the answer
  };
  // The kept buffers of `ns` that hold at least `extent` bytes, smallest first.
  Candidates For(std::string_view ns, uint64_t extent) const;

  // The broker granted `buffer_id` (in `ns`) as recyclable; `mapping` is the producer's.
  void Keep(uint64_t buffer_id, std::string_view ns, std::shared_ptr<Mapping> mapping);
  // The broker freed it: the mapping goes (munmap once no view uses it).
  void Forget(uint64_t buffer_id);
  // Pushes may have been lost: drop every entry.
  void ForgetAll();

 private:
  struct Entry {
    std::string ns;
    std::shared_ptr<Mapping> mapping;
  };
  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::internal
