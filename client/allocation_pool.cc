#include "client/allocation_pool.h"

#include <unistd.h>

#include <algorithm>
#include <bit>

namespace tensord::internal {
namespace {

// The broker's arena slots are whole pages of at least 4 KiB (server/memory/arena.h); a class is
// a whole number of them, so an entry fills its slot exactly.
uint64_t PageBytes() {
  static const uint64_t page = std::max<uint64_t>(4096, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
  return page;
}

}  // namespace

uint64_t AllocationPool::ClassBytes(std::string_view ns, const TensorSpec& spec, uint64_t extent) {
  if (ns.empty() || spec.isolated || !spec.tags.empty() || spec.device.device_type != kDLCPU ||
      extent == 0 || extent > kMaxClassBytes) {
    return 0;
  }
  const uint64_t pages = std::bit_ceil((extent + PageBytes() - 1) / PageBytes());
  const uint64_t bytes = pages * PageBytes();
  return bytes <= kMaxClassBytes ? bytes : 0;
}

AllocationPool::Next AllocationPool::Take(std::string_view ns, uint64_t class_bytes) {
  absl::MutexLock lock(&mu_);
  auto it = classes_.find(Key(std::string(ns), class_bytes));
  if (it == classes_.end() || !it->second.seen || !it->second.pooled) return {};
  Class& c = it->second;
  Next next;
  if (!c.entries.empty()) {
    next.entry = std::move(c.entries.back());
    c.entries.pop_back();
    return next;
  }
  // Doubling keeps a steady producer at few refills; the cap bounds the slots kept idle.
  const size_t cap = std::min<uint64_t>(kMaxRefill, std::max<uint64_t>(1, kMaxRefillBytes / class_bytes));
  next.refill = std::min(c.next_refill, cap);
  c.next_refill = std::min(cap, next.refill * 2);
  return next;
}

void AllocationPool::NoteAllocated(std::string_view ns, uint64_t class_bytes) {
  absl::MutexLock lock(&mu_);
  classes_[Key(std::string(ns), class_bytes)].seen = true;
}

std::optional<AllocationPool::Entry> AllocationPool::Refill(std::string_view ns, uint64_t class_bytes,
                                                            std::vector<Entry> granted,
                                                            std::vector<uint64_t>& release) {
  if (granted.empty()) return std::nullopt;
  const bool all_in_arenas = std::all_of(granted.begin(), granted.end(), [](const Entry& entry) {
    return entry.tensor.buffer().arena();
  });
  absl::MutexLock lock(&mu_);
  Class& c = classes_[Key(std::string(ns), class_bytes)];
  if (!all_in_arenas) {
    // The broker does not put tensors of this class in arenas (arenas off, or too small):
    // a pooled slot would be a dedicated buffer, no cheaper than a plain Allocate.
    c.pooled = false;
    for (const Entry& entry : granted) release.push_back(entry.lease_id);
    for (const Entry& entry : c.entries) release.push_back(entry.lease_id);
    c.entries.clear();
    return std::nullopt;
  }
  std::optional<Entry> mine = std::move(granted.front());
  if (!c.pooled) {
    // Another refill found the class unpoolable meanwhile: keep nothing more.
    for (size_t i = 1; i < granted.size(); ++i) release.push_back(granted[i].lease_id);
    return mine;
  }
  for (size_t i = 1; i < granted.size(); ++i) c.entries.push_back(std::move(granted[i]));
  return mine;
}

std::vector<uint64_t> AllocationPool::TakeAll(std::string_view ns) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  for (auto it = classes_.lower_bound(Key(std::string(ns), 0));
       it != classes_.end() && it->first.first == ns; ++it) {
    for (const Entry& entry : it->second.entries) ids.push_back(entry.lease_id);
    it->second.entries.clear();
  }
  return ids;
}

}  // namespace tensord::internal
