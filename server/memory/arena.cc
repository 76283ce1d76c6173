#include "server/memory/arena.h"

#include <unistd.h>

#include <algorithm>
#include <iterator>

#include "common/check.h"

namespace tensord::server {

uint64_t ArenaAlignment() {
  static const uint64_t page = std::max<uint64_t>(4096, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
  return page;
}

ArenaSlots::ArenaSlots(uint64_t size) : size_(size / ArenaAlignment() * ArenaAlignment()), free_bytes_(size_) {
  if (size_ > 0) free_.emplace(0, size_);
}

uint64_t ArenaSlots::SlotBytes(uint64_t extent) {
  if (extent == 0) return ArenaAlignment();
  return (extent + ArenaAlignment() - 1) / ArenaAlignment() * ArenaAlignment();
}

std::optional<uint64_t> ArenaSlots::Allocate(uint64_t slot_bytes) {
  TENSORD_CHECK(slot_bytes > 0 && slot_bytes % ArenaAlignment() == 0);
  if (slot_bytes > free_bytes_) return std::nullopt;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < slot_bytes) continue;
    uint64_t offset = it->first;
    uint64_t left = it->second - slot_bytes;
    free_.erase(it);
    if (left > 0) free_.emplace(offset + slot_bytes, left);
    free_bytes_ -= slot_bytes;
    return offset;
  }
  return std::nullopt;
}

void ArenaSlots::Free(uint64_t offset, uint64_t slot_bytes) {
  TENSORD_CHECK(slot_bytes > 0 && offset + slot_bytes <= size_);
  auto next = free_.lower_bound(offset);
  // A double free or an overlap is a broker bug, not something a client can cause.
  TENSORD_CHECK(next == free_.end() || next->first >= offset + slot_bytes);
  uint64_t start = offset;
  uint64_t length = slot_bytes;
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    TENSORD_CHECK(prev->first + prev->second <= offset);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == offset + slot_bytes) {
    length += next->second;
    free_.erase(next);
  }
  free_.emplace(start, length);
  free_bytes_ += slot_bytes;
}

}  // namespace tensord::server
