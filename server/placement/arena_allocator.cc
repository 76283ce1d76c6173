#include "server/placement/arena_allocator.h"

#include <algorithm>
#include <optional>

#include "common/check.h"
#include "server/memory/arena.h"

namespace tensord::server {

uint64_t ArenaAllocator::NextArenaBytes(TensorRegistry& registry, const Session& session, const std::string& ns,
                                        uint64_t slot_bytes) const {
  uint64_t bytes = kFirstArenaBytes;
  if (auto arenas = session.arenas.find(ns); arenas != session.arenas.end()) {
    for (uint64_t buffer_id : arenas->second) {
      const Buffer* buffer = registry.FindBuffer(buffer_id);
      TENSORD_CHECK(buffer != nullptr);
      bytes = std::max(bytes, buffer->size * 2);
    }
  }
  while (bytes < slot_bytes) bytes *= 2;
  // --arena-bytes and every slot are page multiples, and a slot is at most --arena-bytes.
  return std::min(bytes, arena_bytes_);
}

bool ArenaAllocator::PlaceInArena(TensorRegistry& registry, Session& session, Tensor& tensor) const {
  auto arenas = session.arenas.find(tensor.ns);
  if (arenas == session.arenas.end()) return false;
  uint64_t slot = ArenaSlots::SlotBytes(tensor.layout.extent);
  for (uint64_t buffer_id : arenas->second) {
    Buffer* buffer = registry.FindBuffer(buffer_id);
    TENSORD_CHECK(buffer != nullptr && buffer->arena != nullptr);
    if (std::optional<uint64_t> offset = buffer->arena->Allocate(slot)) {
      tensor.buffer_id = buffer_id;
      tensor.offset = *offset;
      tensor.slot_bytes = slot;
      return true;
    }
  }
  return false;
}

uint64_t ArenaAllocator::AddArena(TensorRegistry& registry, Session& session, const std::string& ns, uint64_t size,
                              std::unique_ptr<common::BackendBuffer> memory) const {
  Buffer buffer;
  buffer.id = registry.NextBufferId();
  buffer.size = size;
  buffer.memory = std::move(memory);
  buffer.arena = std::make_unique<ArenaSlots>(size);
  buffer.arena_owner = session.id;
  buffer.arena_ns = ns;
  const uint64_t id = buffer.id;
  session.arenas[ns].push_back(id);
  registry.AddBuffer(std::move(buffer));
  return id;
}

std::vector<std::unique_ptr<common::BackendBuffer>> ArenaAllocator::ReleaseArenas(TensorRegistry& registry,
                                                                                  Session& session) const {
  std::vector<std::unique_ptr<common::BackendBuffer>> released;
  for (const auto& [ns, buffer_ids] : session.arenas) {
    for (uint64_t buffer_id : buffer_ids) {
      Buffer* buffer = registry.FindBuffer(buffer_id);
      TENSORD_CHECK(buffer != nullptr);
      buffer->arena_owner = 0;
      if (!buffer->tensor_ids.empty()) continue;  // goes with its last tensor
      released.push_back(registry.RemoveBuffer(buffer_id));
    }
  }
  session.arenas.clear();
  return released;
}

bool ArenaAllocator::Making(uint64_t session_id, const std::string& ns) const {
  return queue_.contains({session_id, ns});
}

void ArenaAllocator::StartMaking(uint64_t session_id, const std::string& ns) {
  bool started = queue_.try_emplace({session_id, ns}).second;
  TENSORD_CHECK(started);
}

void ArenaAllocator::Enqueue(uint64_t session_id, const std::string& ns, QueuedAllocate allocation) {
  auto queued = queue_.find({session_id, ns});
  TENSORD_CHECK(queued != queue_.end());
  queued->second.push_back(std::move(allocation));
}

std::vector<QueuedAllocate> ArenaAllocator::FinishMaking(uint64_t session_id, const std::string& ns) {
  auto queued = queue_.find({session_id, ns});
  TENSORD_CHECK(queued != queue_.end());
  std::vector<QueuedAllocate> allocations = std::move(queued->second);
  queue_.erase(queued);
  return allocations;
}

}  // namespace tensord::server
