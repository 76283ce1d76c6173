#include "server/memory/buffer_pool.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace tensord::server {

BufferPool::Entry BufferPool::Remove(std::map<uint64_t, Entry>::iterator it) {
  Entry entry = std::move(it->second);
  entries_.erase(it);
  seq_of_buffer_.erase(entry.buffer_id);
  auto use = use_.find(entry.session_id);
  TENSORD_CHECK(use != use_.end() && use->second.buffers > 0 && use->second.bytes >= entry.size);
  --use->second.buffers;
  use->second.bytes -= entry.size;
  if (use->second.buffers == 0) use_.erase(use);
  bytes_ -= entry.size;
  auto on_device = bytes_by_device_.find(entry.device);
  TENSORD_CHECK(on_device != bytes_by_device_.end() && on_device->second >= entry.size);
  if ((on_device->second -= entry.size) == 0) bytes_by_device_.erase(on_device);
  return entry;
}

std::vector<BufferPool::Entry> BufferPool::Put(Entry entry) {
  std::vector<Entry> evicted;
  if (!enabled() || entry.size > limits_.max_bytes) {
    evicted.push_back(std::move(entry));
    return evicted;
  }
  const uint64_t session_id = entry.session_id;
  auto fits = [&] {
    auto use = use_.find(session_id);
    return use == use_.end() ||
           (use->second.buffers < limits_.max_buffers && use->second.bytes + entry.size <= limits_.max_bytes);
  };
  // Make room: the session's oldest entries go first.
  for (auto it = entries_.begin(); it != entries_.end() && !fits();) {
    if (it->second.session_id == session_id) {
      evicted.push_back(Remove(it++));
    } else {
      ++it;
    }
  }
  const uint64_t seq = ++next_seq_;
  SessionUse& use = use_[session_id];
  ++use.buffers;
  use.bytes += entry.size;
  bytes_ += entry.size;
  bytes_by_device_[entry.device] += entry.size;
  seq_of_buffer_[entry.buffer_id] = seq;
  entries_.emplace(seq, std::move(entry));
  return evicted;
}

std::optional<BufferPool::Entry> BufferPool::Take(uint64_t session_id, std::string_view ns,
                                                  const ResolvedDevice* device, uint64_t size,
                                                  std::span<const uint64_t> candidates) {
  const uint64_t largest = size + size / 4;
  std::map<uint64_t, Entry>::iterator best = entries_.end();
  for (uint64_t buffer_id : candidates) {
    auto seq = seq_of_buffer_.find(buffer_id);
    if (seq == seq_of_buffer_.end()) continue;
    auto it = entries_.find(seq->second);
    TENSORD_CHECK(it != entries_.end());
    const Entry& entry = it->second;
    if (entry.session_id != session_id || entry.ns != ns || entry.device != device || entry.size < size ||
        entry.size > largest) {
      continue;
    }
    if (best == entries_.end() || entry.size < best->second.size) best = it;
  }
  if (best == entries_.end()) return std::nullopt;
  return Remove(best);
}

std::vector<BufferPool::Entry> BufferPool::EvictOldest(const ResolvedDevice* device, uint64_t bytes) {
  std::vector<Entry> evicted;
  uint64_t freed = 0;
  for (auto it = entries_.begin(); it != entries_.end() && freed < bytes;) {
    if (it->second.device != device) {
      ++it;
      continue;
    }
    freed += it->second.size;
    evicted.push_back(Remove(it++));
  }
  return evicted;
}

std::vector<BufferPool::Entry> BufferPool::RemoveSession(uint64_t session_id) {
  std::vector<Entry> removed;
  if (!use_.contains(session_id)) return removed;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.session_id == session_id) {
      removed.push_back(Remove(it++));
    } else {
      ++it;
    }
  }
  return removed;
}

}  // namespace tensord::server
