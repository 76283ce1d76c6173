#include "server/state/tensor_registry.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "common/check.h"
#include "common/names.h"

namespace tensord::server {

Tensor& TensorRegistry::AddTensor(Tensor tensor) {
  uint64_t id = tensor.id;
  if (tensor.buffer_id != 0) {
    Buffer* buffer = FindBuffer(tensor.buffer_id);
    TENSORD_CHECK(buffer != nullptr);
    buffer->tensor_ids.insert(id);
  }
  auto [it, inserted] = tensors_.emplace(id, std::move(tensor));
  TENSORD_CHECK(inserted);
  Count(usage_, it->second, true);
  return it->second;
}

void TensorRegistry::Count(UsageCounters& counters, const Tensor& tensor, bool count) {
  const uint64_t bytes = tensor.layout.nbytes;
  if (count) {
    counters.AddTensor(tensor.ns, tensor.device, tensor.producer_uid, tensor.producer_session, bytes);
    for (const auto& [session_id, leases] : tensor.holders) counters.AddHolder(session_id, bytes);
  } else {
    counters.RemoveTensor(tensor.ns, tensor.device, tensor.producer_uid, tensor.producer_session, bytes);
    for (const auto& [session_id, leases] : tensor.holders) counters.RemoveHolder(session_id, bytes);
  }
}

void TensorRegistry::SetNamespaceAndLayout(Tensor& tensor, std::string ns, common::TensorLayout layout) {
  Count(usage_, tensor, false);
  tensor.ns = std::move(ns);
  tensor.layout = std::move(layout);
  Count(usage_, tensor, true);
}

void TensorRegistry::AddHolder(Tensor& tensor, uint64_t session_id, bool by_name) {
  if (++tensor.holders[session_id] == 1) usage_.AddHolder(session_id, tensor.layout.nbytes);
  if (by_name) tensor.name_holders.insert(session_id);
}

void TensorRegistry::RemoveHolder(Tensor& tensor, uint64_t session_id) {
  auto holder = tensor.holders.find(session_id);
  TENSORD_CHECK(holder != tensor.holders.end() && holder->second > 0);
  if (--holder->second > 0) return;
  tensor.holders.erase(holder);
  tensor.name_holders.erase(session_id);
  usage_.RemoveHolder(session_id, tensor.layout.nbytes);
}

UsageCounters TensorRegistry::RecountUsageForTest() const {
  UsageCounters counters;
  for (const auto& [id, tensor] : tensors_) Count(counters, tensor, true);
  return counters;
}

void TensorRegistry::AddBuffer(Buffer buffer) {
  uint64_t id = buffer.id;
  bool inserted = buffers_.emplace(id, std::move(buffer)).second;
  TENSORD_CHECK(inserted);
}

Tensor* TensorRegistry::Find(uint64_t tensor_id) {
  auto it = tensors_.find(tensor_id);
  return it == tensors_.end() ? nullptr : &it->second;
}

Buffer* TensorRegistry::FindBuffer(uint64_t buffer_id) {
  auto it = buffers_.find(buffer_id);
  return it == buffers_.end() ? nullptr : &it->second;
}

std::optional<std::string> TensorRegistry::NearestBoundName(std::string_view name) const {
  constexpr int kNeighbours = 8;  // each side of where `name` would sort
  // Up to a third of the name's length after its namespace, at most 3 edits; none for
  // names too short to tell a typo from another name ("a/x" and "a/y").
  const std::string_view ns = common::NamespaceOf(name);
  const size_t limit = std::min<size_t>((name.size() - ns.size()) / 3, 3);
  if (limit == 0) return std::nullopt;
  std::optional<std::string> nearest;
  size_t nearest_distance = limit + 1;
  // Names that differ from `name` only in digits are a numbered series ("batch/0001" is no
  // typo of "batch/0002", just published before it).
  auto differs_only_in_digits = [&](const std::string& candidate) {
    if (candidate.size() != name.size()) return false;
    for (size_t i = 0; i < name.size(); ++i) {
      if (candidate[i] != name[i] && !(absl::ascii_isdigit(candidate[i]) && absl::ascii_isdigit(name[i]))) return false;
    }
    return true;
  };
  auto consider = [&](const std::string& candidate) {
    if (common::NamespaceOf(candidate) != ns || differs_only_in_digits(candidate)) return;
    if (auto distance = common::EditDistanceWithin(name, candidate, limit); distance && *distance < nearest_distance) {
      nearest = candidate;
      nearest_distance = *distance;
    }
  };
  const auto at = names_.lower_bound(std::string(name));
  auto forward = at;
  for (int i = 0; i < kNeighbours && forward != names_.end(); ++i, ++forward) consider(forward->first);
  auto backward = at;
  for (int i = 0; i < kNeighbours && backward != names_.begin(); ++i) consider((--backward)->first);
  return nearest;
}

Tensor* TensorRegistry::FindByName(const std::string& name) {
  auto it = names_.find(name);
  return it == names_.end() ? nullptr : Find(it->second);
}

void TensorRegistry::Enqueue(std::string_view name, uint64_t generation, uint64_t tensor_id) {
  for (size_t slash = name.find('/'); slash != std::string_view::npos; slash = name.find('/', slash + 1)) {
    queues_[std::string(name.substr(0, slash + 1))].emplace(generation, tensor_id);
  }
}

void TensorRegistry::Dequeue(std::string_view name, uint64_t generation, uint64_t tensor_id) {
  for (size_t slash = name.find('/'); slash != std::string_view::npos; slash = name.find('/', slash + 1)) {
    auto queue = queues_.find(std::string(name.substr(0, slash + 1)));
    TENSORD_CHECK(queue != queues_.end() && queue->second.erase({generation, tensor_id}) == 1);
    if (queue->second.empty()) queues_.erase(queue);
  }
}

uint64_t TensorRegistry::Bind(const std::string& name, Tensor& tensor, uint64_t generation) {
  uint64_t previous = 0;
  auto [it, inserted] = names_.try_emplace(name, tensor.id);
  if (!inserted) {
    previous = it->second;
    it->second = tensor.id;
    if (Tensor* old = Find(previous)) {
      Dequeue(name, old->generation, old->id);
      old->name.clear();
    }
  }
  tensor.name = name;
  tensor.generation = generation;
  Enqueue(name, generation, tensor.id);
  return previous;
}

void TensorRegistry::Unbind(Tensor& tensor) {
  if (tensor.name.empty()) return;
  auto it = names_.find(tensor.name);
  if (it != names_.end() && it->second == tensor.id) {
    names_.erase(it);
    Dequeue(tensor.name, tensor.generation, tensor.id);
  }
  tensor.name.clear();
}

std::unique_ptr<common::BackendBuffer> TensorRegistry::Remove(uint64_t tensor_id) {
  auto it = tensors_.find(tensor_id);
  TENSORD_CHECK(it != tensors_.end());
  TENSORD_CHECK(it->second.name.empty() && it->second.leases == 0 && it->second.hand_overs == 0);
  uint64_t buffer_id = it->second.buffer_id;
  uint64_t offset = it->second.offset;
  uint64_t slot_bytes = it->second.slot_bytes;
  Count(usage_, it->second, false);
  tensors_.erase(it);
  if (buffer_id == 0) return nullptr;
  auto buffer = buffers_.find(buffer_id);
  TENSORD_CHECK(buffer != buffers_.end() && buffer->second.tensor_ids.erase(tensor_id) == 1);
  if (buffer->second.arena != nullptr) {
    buffer->second.arena->Free(offset, slot_bytes);
    if (buffer->second.arena_owner != 0) return nullptr;  // its owner's pool
  }
  if (!buffer->second.tensor_ids.empty()) return nullptr;
  std::unique_ptr<common::BackendBuffer> memory = std::move(buffer->second.memory);
  buffers_.erase(buffer);
  return memory;
}

std::unique_ptr<common::BackendBuffer> TensorRegistry::RemoveBuffer(uint64_t buffer_id) {
  auto buffer = buffers_.find(buffer_id);
  TENSORD_CHECK(buffer != buffers_.end() && buffer->second.tensor_ids.empty());
  std::unique_ptr<common::BackendBuffer> memory = std::move(buffer->second.memory);
  buffers_.erase(buffer);
  return memory;
}

Tensor* TensorRegistry::OldestUnder(const std::string& prefix) {
  auto queue = queues_.find(prefix);
  if (queue == queues_.end()) return nullptr;
  Tensor* oldest = Find(queue->second.begin()->second);
  TENSORD_CHECK(oldest != nullptr);
  return oldest;
}

size_t TensorRegistry::CountUnder(const std::string& prefix) const {
  auto queue = queues_.find(prefix);
  return queue == queues_.end() ? 0 : queue->second.size();
}

tensord::v1::TensorInfo TensorRegistry::Describe(const Tensor& tensor) const {
  tensord::v1::TensorInfo info;
  info.set_tensor_id(tensor.id);
  info.set_name(tensor.name);
  info.set_generation(tensor.generation);
  *info.mutable_desc() = tensor.desc;
  // Strides always filled in, so clients never guess the layout.
  info.mutable_desc()->mutable_strides()->Assign(tensor.layout.strides.begin(),
                                                 tensor.layout.strides.end());
  tensord::v1::BufferRef* ref = info.mutable_buffer();
  ref->set_buffer_id(tensor.buffer_id);
  ref->set_offset(tensor.offset);
  ref->set_extent(tensor.layout.extent);
  if (tensor.buffer_id != 0) {
    auto buffer = buffers_.find(tensor.buffer_id);
    if (buffer != buffers_.end()) {
      ref->set_size(buffer->second.size);
      ref->set_arena(buffer->second.arena != nullptr);
      ref->set_recyclable(buffer->second.recyclable);
    }
  }
  info.set_state(tensor.state);
  for (const auto& [key, value] : tensor.tags) (*info.mutable_tags())[key] = value;
  info.set_created_unix_ms(tensor.created_unix_ms);
  info.set_lease_count(tensor.leases);
  info.set_nbytes(tensor.layout.nbytes);
  return info;
}

}  // namespace tensord::server
