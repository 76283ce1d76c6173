#include "server/placement/placement.h"

#include <utility>

#include "server/memory/arena.h"

namespace tensord::server {
namespace {

Placement::Choice Chosen(Placement::Kind kind, uint64_t bytes = 0) {
  Placement::Choice choice;
  choice.kind = kind;
  choice.bytes = bytes;
  return choice;
}

}  // namespace

bool Placement::InArena(const Tensor& tensor, const Request& request) const {
  const uint64_t extent = tensor.layout.extent;
  return tensor.device == host_ && extent > 0 && !tensor.ns.empty() && !request.isolated &&
         limits_.arena_bytes > 0 && extent <= limits_.arena_max_tensor_bytes && extent <= limits_.arena_bytes;
}

Placement::Choice Placement::ChooseArena(TensorRegistry& registry, Session& session, Tensor& tensor) {
  if (arenas_.PlaceInArena(registry, session, tensor)) return Chosen(Kind::kArenaSlot);
  // An arena for this namespace is being made: wait for it rather than make another.
  if (arenas_.Making(session.id, tensor.ns)) return Chosen(Kind::kAwaitArena);
  return Chosen(Kind::kNewArena,
                arenas_.NextArenaBytes(registry, session, tensor.ns, ArenaSlots::SlotBytes(tensor.layout.extent)));
}

Placement::Choice Placement::ChooseBuffer(const Session& session, const Tensor& tensor, const Request& request,
                                          uint64_t size) {
  if (size == 0) return Chosen(Kind::kNoMemory);
  if (request.recyclable) {
    // Memory this producer filled before and still maps: no new buffer, no executor trip.
    if (std::optional<BufferPool::Entry> pooled =
            pool_.Take(session.id, tensor.ns, tensor.device, size, request.reuse_buffer_ids)) {
      Choice choice = Chosen(Kind::kRecycled, size);
      choice.recycled = std::move(pooled);
      return choice;
    }
  }
  return Chosen(Kind::kDedicated, size);
}

Placement::Overflow Placement::PlaceBatch(TensorRegistry& registry, Session& session,
                                          std::vector<QueuedAllocate> batch,
                                          absl::FunctionRef<bool(QueuedAllocate&)> admit,
                                          absl::FunctionRef<void(QueuedAllocate&)> placed) {
  Overflow overflow;
  for (QueuedAllocate& allocation : batch) {
    if (!admit(allocation)) continue;
    if (arenas_.PlaceInArena(registry, session, allocation.tensor)) {
      placed(allocation);
    } else {
      overflow.allocations.push_back(std::move(allocation));
    }
  }
  if (!overflow.allocations.empty()) {
    const Tensor& first = overflow.allocations.front().tensor;
    overflow.next_arena_bytes =
        arenas_.NextArenaBytes(registry, session, first.ns, ArenaSlots::SlotBytes(first.layout.extent));
  }
  return overflow;
}

}  // namespace tensord::server
