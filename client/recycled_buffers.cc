#include "client/recycled_buffers.h"

#include <algorithm>
#include <utility>

namespace tensord::internal {

RecycledBuffers::Candidates RecycledBuffers::For(std::string_view ns, uint64_t extent) const {
  Candidates candidates;
  std::vector<std::pair<uint64_t, uint64_t>> fitting;  // size, buffer id
  absl::MutexLock lock(&mu_);
  for (const auto& [buffer_id, entry] : entries_) {
    if (entry.ns == ns && entry.mapping->size() >= extent) fitting.emplace_back(entry.mapping->size(), buffer_id);
  }
  std::sort(fitting.begin(), fitting.end());
  if (fitting.size() > kMaxCandidates) fitting.resize(kMaxCandidates);
  for (const auto& [size, buffer_id] : fitting) {
    candidates.buffer_ids.push_back(buffer_id);
    candidates.held.push_back(entries_.at(buffer_id).mapping);
  }
  return candidates;
}

void RecycledBuffers::Keep(uint64_t buffer_id, std::string_view ns, std::shared_ptr<Mapping> mapping) {
  std::shared_ptr<Mapping> replaced;  // declared first: released after the mutex
  absl::MutexLock lock(&mu_);
  Entry& entry = entries_[buffer_id];
  entry.ns = std::string(ns);
  replaced = std::exchange(entry.mapping, std::move(mapping));
}

void RecycledBuffers::Forget(uint64_t buffer_id) {
  std::shared_ptr<Mapping> dropped;  // declared first: unmapped after the mutex
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(buffer_id);
  if (it == entries_.end()) return;
  dropped = std::move(it->second.mapping);
  entries_.erase(it);
}

void RecycledBuffers::ForgetAll() {
  std::map<uint64_t, Entry> dropped;  // declared first: unmapped after the mutex
  absl::MutexLock lock(&mu_);
  dropped.swap(entries_);
}

}  // namespace tensord::internal
