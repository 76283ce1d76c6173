// RemoteNames: the names this node shares with other nodes (a cluster's namespaces), as the
// broker sees them. The broker knows nothing of etcd, peers or transfers: for a shared
// name that is not bound here it asks Fetch to bring the tensor the cluster has under that
// name into this node (a replica, bound here under the name), then acquires it as any local
// name; a take that finds nothing here asks FetchTake to move one here, then takes it.
// Implemented by server/cluster/ (ClusterNode); a broker without one shares nothing.
//
// Thread-safety: every method may be called from any thread, never under the broker's
// mutex; done never runs inside Fetch's caller's stack frame under a lock of the broker.
#pragma once

#include <string>
#include <string_view>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"

namespace tensord::server {

class RemoteNames {
 public:
  using FetchDone = absl::AnyInvocable<void(absl::Status) &&>;

  virtual ~RemoteNames() = default;
  // Whether `name` lies in a namespace shared across the cluster.
  virtual bool Shares(std::string_view name) const = 0;
  // Makes `name` bound here as the cluster has it, then runs done exactly once: OK once it
  // is bound here (or when this node is its owner), NOT_FOUND when no node has it,
  // UNAVAILABLE naming the node or the directory that could not be reached. Concurrent
  // fetches of one name share one transfer.
  virtual void Fetch(const std::string& name, FetchDone done) = 0;
  // Moves one tensor that another node has bound to `name_or_prefix` (a name, or the oldest
  // under a prefix ending in '/') to this node, bound here under its name, taken from its
  // owner exactly once (the owner's broker unbinds it only if nobody took it there first),
  // then runs done exactly once: OK once it is bound here, NOT_FOUND when no other node has
  // one, UNAVAILABLE naming what could not be reached. Each call moves its own tensor.
  virtual void FetchTake(const std::string& name_or_prefix, FetchDone done) = 0;
};

}  // namespace tensord::server
