// ArenaAllocator: which arena a small tensor goes in, how large a session's next arena is,
// and the allocations waiting while an arena is being made.
//
// Arenas are registry buffers (Buffer::arena set) listed by their owner session per
// namespace (Session::arenas); this class places tensors in them, adds new ones and lets a
// closing session's go, working on the registry and the session it is given. A session's
// first arena in a namespace is kFirstArenaBytes (or its first slot, if larger); each next
// one is twice its largest there, never more than --arena-bytes.
//
// While an arena is being made for (session, namespace) (StartMaking to FinishMaking),
// further allocations of that session in that namespace queue here in order instead of
// each making one; a key exists exactly while its arena is being made. Memory accounting
// and freeing are the broker's: ReleaseArenas hands back the memory it takes out.
// Not thread-safe: the Broker guards it with its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/memory/memory_backend.h"
#include "server/runtime/completion.h"
#include "server/state/session_manager.h"
#include "server/state/tensor_registry.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::server {

// An allocation waiting for the arena being made for its session and namespace.
struct QueuedAllocate {
  Tensor tensor;
  Completion<tensord::v1::AllocateResponse> done;
};

class ArenaAllocator {
 public:
  // `arena_bytes`: the largest arena (--arena-bytes), a page multiple.
  explicit ArenaAllocator(uint64_t arena_bytes) : arena_bytes_(arena_bytes) {}

  // The size of the session's next arena in `ns` for a slot of `slot_bytes` (at most
  // --arena-bytes, which a slot never passes).
  uint64_t NextArenaBytes(TensorRegistry& registry, const Session& session, const std::string& ns,
                          uint64_t slot_bytes) const;
  // Puts `tensor` in a free slot of one of the session's arenas for its namespace (sets its
  // buffer, offset and slot); false when none has room.
  bool PlaceInArena(TensorRegistry& registry, Session& session, Tensor& tensor) const;
  // Registers `memory` (of `size` bytes) as a new arena of `session` in `ns`.
  // Returns the new arena's buffer id.
  uint64_t AddArena(TensorRegistry& registry, Session& session, const std::string& ns, uint64_t size,
                std::unique_ptr<common::BackendBuffer> memory) const;
  // The session closed: its arenas go once empty. Removes those empty now from the registry
  // and returns their memory; the others go with their last tensor.
  std::vector<std::unique_ptr<common::BackendBuffer>> ReleaseArenas(TensorRegistry& registry,
                                                                    Session& session) const;

  // Whether an arena is being made for the session in `ns`.
  bool Making(uint64_t session_id, const std::string& ns) const;
  void StartMaking(uint64_t session_id, const std::string& ns);
  // Queues an allocation behind the arena being made (Making is true).
  void Enqueue(uint64_t session_id, const std::string& ns, QueuedAllocate allocation);
  // The arena is made (or failed): ends Making and returns what queued behind it, in order.
  std::vector<QueuedAllocate> FinishMaking(uint64_t session_id, const std::string& ns);

 private:
  const uint64_t arena_bytes_;
  std::map<std::pair<uint64_t, std::string>, std::vector<QueuedAllocate>> queue_;
};

}  // namespace tensord::server
