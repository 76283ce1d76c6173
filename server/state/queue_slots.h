// QueueSlots: the slots of bounded work queues (broker.proto's QueueSlot) and the
// allocations waiting for one.
//
// A queue is a prefix ending in '/'. `held` counts the tensors that hold one of its slots
// (from their allocation until they leave the queue); an allocation asking for a slot gets
// one while `held` is below the depth it asks with, else waits, oldest first per queue. The
// broker calls Free when a tensor leaves the queue and then Admit, which hands the freed
// room to the oldest waiters that fit. A queue with no slot held and no waiter is
// forgotten. Wait ids are never reused and never collide with WaitQueue's (kFirstWaitId):
// one CancelWait serves both.
//
// It owns the waiters and their completions until they are removed; the broker keeps the
// rest (sessions' wait counts, uid charges recorded in a waiter, timers). Not thread-safe:
// the Broker guards it with its mutex.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "server/runtime/completion.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::server {

// An allocation waiting for a slot, with everything needed to carry it out once admitted;
// request.queue() names the queue and the depth it waits for.
struct SlotWaiter {
  uint64_t session_id = 0;
  uid_t uid = 0;
  uint64_t metadata_bytes = 0;  // charged to uid
  uint64_t timer_id = 0;
  tensord::v1::AllocateRequest request;
  Completion<tensord::v1::AllocateResponse> done;
};

class QueueSlots {
 public:
  // Above any id WaitQueue hands out.
  static constexpr uint64_t kFirstWaitId = uint64_t{1} << 62;

  // Takes a slot of `prefix` when fewer than `depth` are held and nobody waits there
  // (waiters go first); false when the caller must wait.
  bool TryHold(const std::string& prefix, uint32_t depth);
  // A slot of `prefix` was given up (its tensor left the queue, or its allocation failed).
  void Free(const std::string& prefix);
  // Removes and returns the oldest waiters of `prefix` that now fit, each holding its slot.
  std::vector<SlotWaiter> Admit(const std::string& prefix);

  // Queues `waiter` behind the others of its queue; returns its wait id.
  uint64_t Wait(SlotWaiter waiter);
  SlotWaiter* Find(uint64_t wait_id);
  // The removed waiter, or nullopt when there is none with that id.
  std::optional<SlotWaiter> Remove(uint64_t wait_id);
  // Removes and returns the session's waiters (its session closed).
  std::vector<SlotWaiter> RemoveSession(uint64_t session_id);
  // Removes and returns every waiter (shutdown).
  std::vector<SlotWaiter> RemoveAll();

  struct QueueState {
    std::string prefix;
    uint32_t held = 0;
    uint32_t depth = 0;  // the depth the last allocation asked with
    uint32_t waiting = 0;
  };
  // Every queue known, in prefix order.
  std::vector<QueueState> States() const;
  // Counts a slot held by a tensor carried from another daemon (a take-over), whatever the
  // depth: the queue is as full as the old daemon left it.
  void Hold(const std::string& prefix);
  size_t waiters() const { return waiters_.size(); }

 private:
  struct Queue {
    uint32_t held = 0;
    uint32_t depth = 0;
    std::deque<uint64_t> waiting;  // wait ids, oldest first
  };
  void ForgetIfIdle(std::map<std::string, Queue>::iterator queue);
  SlotWaiter RemoveEntry(std::map<uint64_t, SlotWaiter>::iterator entry);

  uint64_t last_id_ = kFirstWaitId;
  std::map<std::string, Queue> queues_;
  std::map<uint64_t, SlotWaiter> waiters_;  // by id: oldest first
};

}  // namespace tensord::server
