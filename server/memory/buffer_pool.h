// BufferPool: recycled dedicated buffers, kept for the session that produced them.
//
// When the last tensor of a recyclable buffer goes (AllocateRequest.recyclable: its producer
// keeps its writable mapping), the broker puts the buffer here instead of freeing it, so that
// session's next allocation of about the same size in the same namespace writes into memory
// that is already allocated, zeroed once and mapped: no memfd, no fallocate, no page faults.
// A buffer only ever carries tensors of one namespace: a reader who kept its fd or mapping
// sees later tensors of a namespace it could read, as with an arena.
//
// Bounds: per session, at most `max_buffers` buffers and `max_bytes` bytes; putting one more
// evicts that session's oldest. Pooled bytes stay reserved in the broker's MemoryQuota (the
// caller releases them when it frees an entry) and are taken back, oldest first across all
// sessions, before an allocation fails for want of quota (EvictOldest). A closing session's
// entries all go (RemoveSession).
//
// Any memory kind whose BackendBuffer is Recyclable() pools here (host memfds, CUDA VMM
// allocations): the pool only counts bytes per device, and the quota is the device's.
//
// Ownership: entries own their BackendBuffer; every entry that leaves the pool other than by
// Take is returned to the caller, which frees it (off the RPC threads) and tells its session
// and the sessions that fetched its handle (`readers`).
// Not thread-safe: the Broker guards it with its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/memory/memory_backend.h"
#include "server/memory/backend_registry.h"

namespace tensord::server {

// Defaults of --recycle-buffers-per-session and --recycle-bytes-per-session.
inline constexpr uint64_t kDefaultRecycleBuffersPerSession = 16;
inline constexpr uint64_t kDefaultRecycleBytesPerSession = uint64_t{1} << 30;

class BufferPool {
 public:
  struct Limits {
    uint64_t max_buffers = 0;  // per session; 0: recycling off
    uint64_t max_bytes = 0;    // per session; 0: recycling off
  };

  struct Entry {
    uint64_t buffer_id = 0;
    uint64_t session_id = 0;
    std::string ns;                          // the namespace of every tensor it carried
    const ResolvedDevice* device = nullptr;  // BackendRegistry's
    uint64_t size = 0;                       // the buffer's (rounded) bytes
    bool reader_sealed = false;              // Buffer::reader_sealed, carried across uses
    absl::flat_hash_set<uint64_t> readers;   // Buffer::readers, carried across uses
    std::unique_ptr<common::BackendBuffer> memory;
  };

  explicit BufferPool(Limits limits) : limits_(limits) {}

  bool enabled() const { return limits_.max_buffers > 0 && limits_.max_bytes > 0; }

  // Keeps `entry`. Returns what leaves to make room: the session's oldest entries, or
  // `entry` itself when it alone is larger than the session's byte bound.
  std::vector<Entry> Put(Entry entry);

  // Removes and returns the best fit for an allocation of `size` bytes by `session_id` in
  // `ns` on `device`: the smallest pooled buffer named in `candidates` of at least `size`
  // and at most a quarter more (a larger one would hold memory the tensor cannot use).
  std::optional<Entry> Take(uint64_t session_id, std::string_view ns, const ResolvedDevice* device,
                            uint64_t size, std::span<const uint64_t> candidates);

  // Removes the oldest entries on `device`, of any session, until they add up to at least
  // `bytes` or none is left.
  std::vector<Entry> EvictOldest(const ResolvedDevice* device, uint64_t bytes);

  // Removes every entry of the session.
  std::vector<Entry> RemoveSession(uint64_t session_id);

  uint64_t bytes() const { return bytes_; }
  // The pooled bytes on `device`.
  uint64_t bytes_on(const ResolvedDevice* device) const {
    auto it = bytes_by_device_.find(device);
    return it == bytes_by_device_.end() ? 0 : it->second;
  }
  size_t size() const { return entries_.size(); }

 private:
  struct SessionUse {
    uint64_t buffers = 0;
    uint64_t bytes = 0;
  };
  // Forgets the entry at `it` and returns it.
  Entry Remove(std::map<uint64_t, Entry>::iterator it);

  const Limits limits_;
  uint64_t next_seq_ = 0;
  std::map<uint64_t, Entry> entries_;  // by put order: the first is the oldest
  std::map<uint64_t, uint64_t> seq_of_buffer_;
  std::map<uint64_t, SessionUse> use_;  // by session
  uint64_t bytes_ = 0;
  std::map<const ResolvedDevice*, uint64_t> bytes_by_device_;
};

}  // namespace tensord::server
