// ArenaSlots: where small tensors go inside one arena buffer.
//
// An arena is a memfd owned by one producer session and one namespace; small tensors are
// carved out of it so a consumer maps it once and later acquires in it need no fd and no
// mmap. Slots are whole pages (ArenaAlignment()); first fit over a free list that
// coalesces neighbours on Free. A slot is freed only when its tensor is dropped (no binding,
// no lease), so a reused slot is never visible through an old lease. Not thread-safe: the
// Broker guards it with its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace tensord::server {

// Small tensors allocated in a namespace are carved out of arenas of this size.
inline constexpr uint64_t kDefaultArenaBytes = uint64_t{16} << 20;
inline constexpr uint64_t kDefaultArenaMaxTensorBytes = uint64_t{1} << 20;

// Slots are whole pages (this machine's, at least 4 KiB): a reader's copy-on-write pages of
// one tensor must never hold a neighbour or the slot's next tensor.
uint64_t ArenaAlignment();

// A session's first arena in a namespace has this size (or its first slot's, if larger);
// each next one is twice the largest it has, up to --arena-bytes. A client with a few small
// tensors costs little; a busy producer soon gets arenas of full size.
inline constexpr uint64_t kFirstArenaBytes = uint64_t{256} << 10;

class ArenaSlots {
 public:
  explicit ArenaSlots(uint64_t size);

  // Bytes a tensor with this extent takes in an arena (aligned up; at least one unit).
  static uint64_t SlotBytes(uint64_t extent);

  // The offset of a free slot of `slot_bytes` (a SlotBytes() value), or nullopt when no free
  // range is large enough.
  std::optional<uint64_t> Allocate(uint64_t slot_bytes);
  // Returns a slot given by Allocate.
  void Free(uint64_t offset, uint64_t slot_bytes);

  uint64_t size() const { return size_; }
  uint64_t free_bytes() const { return free_bytes_; }
  bool unused() const { return free_bytes_ == size_; }

 private:
  const uint64_t size_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length; never two adjacent ranges
};

}  // namespace tensord::server
