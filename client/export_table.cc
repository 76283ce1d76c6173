#include "client/export_table.h"

#include <utility>

namespace tensord::internal {

void ExportTable::Add(uint64_t tensor_id, uint64_t buffer_id, Source source) {
  absl::MutexLock lock(&mu_);
  Entry& entry = held_[tensor_id];
  // Tensor ids are never reused within a broker instance; should one come twice, the old
  // source is dropped later, like any released one, not here under the lock.
  if (entry.source != nullptr) released_.push_back(std::move(entry.source));
  entry = Entry{buffer_id, std::move(source)};
}

bool ExportTable::Release(uint64_t tensor_id, uint64_t buffer_id) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tensor_id);
  if (it == held_.end() || (buffer_id != 0 && it->second.buffer_id != buffer_id)) return false;
  released_.push_back(std::move(it->second.source));
  held_.erase(it);
  return true;
}

std::vector<ExportTable::Source> ExportTable::TakeReleased() {
  std::vector<Source> out;
  absl::MutexLock lock(&mu_);
  out.swap(released_);
  return out;
}

std::vector<ExportTable::Source> ExportTable::TakeHeld() {
  std::vector<Source> out;
  absl::MutexLock lock(&mu_);
  out.reserve(held_.size());
  for (auto& [tensor_id, entry] : held_) out.push_back(std::move(entry.source));
  held_.clear();  // only empty shared_ptrs are destroyed here
  return out;
}

std::vector<uint64_t> ExportTable::HeldTensorIds() const {
  std::vector<uint64_t> ids;
  absl::MutexLock lock(&mu_);
  ids.reserve(held_.size());
  for (const auto& [tensor_id, entry] : held_) ids.push_back(tensor_id);
  return ids;
}

size_t ExportTable::held() const {
  absl::MutexLock lock(&mu_);
  return held_.size();
}

void ExportTable::MarkUnsure() {
  absl::MutexLock lock(&mu_);
  unsure_ = true;
}

bool ExportTable::TakeUnsure() {
  absl::MutexLock lock(&mu_);
  return std::exchange(unsure_, false);
}

}  // namespace tensord::internal
