// WaitQueue: the pending acquires and takes, oldest first, and which of them a tensor that
// was just published (or bound) satisfies.
//
// It owns the waiters and their completions until they are removed; wait ids are never
// reused within a broker instance. A waiter stays until the broker removes it (granted,
// failed, timed out, cancelled, or its session closed). Match answers in the order the
// broker grants: every matching acquire first (by name, at or above its generation, or by
// tensor id), then the matching takes oldest first (by name, or by a prefix ending in '/'),
// of which only the first that may be granted gets the tensor.
//
// The broker keeps the rest: each session's count of waits, the uid charges recorded in a
// waiter (uid, metadata_bytes), its timer, and the access checks at the grant.
// Not thread-safe: the Broker guards it with its mutex.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "server/runtime/completion.h"
#include "server/state/tensor_registry.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::server {

struct Waiter {
  enum class Kind { kAcquireName, kAcquireId, kTake };
  uint64_t session_id = 0;
  uid_t uid = 0;
  uint64_t metadata_bytes = 0;  // charged to uid
  Kind kind = Kind::kAcquireName;
  std::string target;  // name, or prefix ending in '/' for a take
  uint64_t tensor_id = 0;
  uint64_t min_generation = 0;
  tensord::v1::DeviceType memory_type = tensord::v1::DEVICE_TYPE_UNSPECIFIED;  // a take's
  uint64_t timer_id = 0;
  Completion<tensord::v1::AcquireResponse> done;
};

class WaitQueue {
 public:
  // Returns the new waiter's id.
  uint64_t Add(Waiter waiter);
  // The waiter with this id, or null.
  Waiter* Find(uint64_t wait_id);
  // The removed waiter, or nullopt when there is none with that id.
  std::optional<Waiter> Remove(uint64_t wait_id);
  // Removes and returns the session's waiters, oldest first (its session closed).
  std::vector<Waiter> RemoveSession(uint64_t session_id);

  // The waiters `tensor` satisfies as it stands now, by id, each list oldest first.
  struct Matches {
    std::vector<uint64_t> acquires;
    std::vector<uint64_t> takes;
  };
  Matches Match(const Tensor& tensor) const;

  // How many takes wait for a tensor under `prefix` (ending in '/').
  size_t TakesWaitingFor(const std::string& prefix) const;
  // Every waiter's id, oldest first.
  std::vector<uint64_t> Ids() const;
  size_t size() const { return waiters_.size(); }

 private:
  uint64_t last_id_ = 0;
  std::map<uint64_t, Waiter> waiters_;  // by id: oldest first
};

}  // namespace tensord::server
