// Placement: where a new tensor's memory comes from, the policy behind every Allocate:
//  - no memory, for a tensor of no bytes;
//  - a slot of one of its session's arenas, for a small host tensor in a namespace (at most
//    --arena-max-tensor and --arena-bytes, not asked to be isolated): a free slot now, else
//    a place in the queue behind the arena being made for that session and namespace, else
//    a new arena of the session's next arena size (ArenaAllocator);
//  - a buffer from its session's pool, when the producer asked for a recyclable one: the
//    same namespace, device and about the same size, among the buffers it still maps
//    (BufferPool::Take);
//  - else a dedicated buffer of the tensor's size as its backend rounds it.
// InArena says which of the two a tensor is for; ChooseArena or ChooseBuffer then decides and
// takes what it names (an arena slot, a pooled buffer). Once a new arena is made, PlaceBatch
// decides where the allocations that waited for it go: its slots, or the next arena.
// Reserving memory, making buffers and arenas, queueing and answering the caller are the
// broker's. The host device is the BackendRegistry's. Not thread-safe: the Broker guards it
// with its mutex.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "server/memory/backend_registry.h"
#include "server/memory/buffer_pool.h"
#include "server/placement/arena_allocator.h"
#include "server/state/session_manager.h"
#include "server/state/tensor_registry.h"

namespace tensord::server {

class Placement {
 public:
  struct Limits {
    uint64_t arena_bytes = 0;  // --arena-bytes; 0: no arenas
    uint64_t arena_max_tensor_bytes = 0;
  };

  // What the allocation asked for besides its description.
  struct Request {
    bool isolated = false;    // never in an arena
    bool recyclable = false;  // may reuse, and go back to, the session's pool
    std::span<const uint64_t> reuse_buffer_ids;  // pooled buffers the producer still maps
  };

  enum class Kind {
    kNoMemory,    // a tensor of no bytes
    kArenaSlot,   // placed: the tensor's buffer, offset and slot are set
    kAwaitArena,  // queue it behind the arena being made for its session and namespace
    kNewArena,    // make an arena of `bytes` for its session and namespace
    kRecycled,    // `recycled` is its buffer, taken from the pool
    kDedicated,   // make a buffer of `bytes`
  };
  struct Choice {
    Kind kind = Kind::kNoMemory;
    uint64_t bytes = 0;
    std::optional<BufferPool::Entry> recycled;
  };

  // The allocations that waited for a new arena, PlaceBatch's overflow: those no arena of
  // their session had room for, in order. The first makes the next arena, of
  // `next_arena_bytes`; the others wait for it.
  struct Overflow {
    std::vector<QueuedAllocate> allocations;
    uint64_t next_arena_bytes = 0;  // 0 when there are none
  };

  Placement(Limits limits, const ResolvedDevice* host, ArenaAllocator& arenas, BufferPool& pool)
      : limits_(limits), host_(host), arenas_(arenas), pool_(pool) {}

  // Whether `tensor` (its device, namespace and layout set) belongs in an arena: its bytes
  // are then the namespace's arena's, not charged to its producer's uid as a buffer. Asked
  // once per allocation: ChooseArena places a tensor that does, ChooseBuffer any other.
  bool InArena(const Tensor& tensor, const Request& request) const;
  // Where `tensor` of `session`, which belongs in an arena, goes: kArenaSlot, kAwaitArena or
  // kNewArena (its `bytes` the session's next arena size for that namespace).
  Choice ChooseArena(TensorRegistry& registry, Session& session, Tensor& tensor);
  // Where `tensor` of `session`, which does not, goes: kNoMemory, kRecycled or kDedicated;
  // `size` is its extent as its backend rounds it.
  Choice ChooseBuffer(const Session& session, const Tensor& tensor, const Request& request, uint64_t size);
  // A new arena of `session` was added for the namespace of `batch`: the allocation that made
  // it, then those queued behind it (ArenaAllocator::FinishMaking). In order, each that
  // `admit` lets through (the broker's caps; it answers one it refuses, which takes no slot)
  // goes in a free slot of the session's arenas there and then to `placed` (the broker
  // registers it before the next is admitted), or, with none free, to the overflow.
  Overflow PlaceBatch(TensorRegistry& registry, Session& session, std::vector<QueuedAllocate> batch,
                      absl::FunctionRef<bool(QueuedAllocate&)> admit,
                      absl::FunctionRef<void(QueuedAllocate&)> placed);

 private:
  const Limits limits_;
  const ResolvedDevice* const host_;
  ArenaAllocator& arenas_;
  BufferPool& pool_;
};

}  // namespace tensord::server
