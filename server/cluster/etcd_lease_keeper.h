// EtcdLeaseKeeper: holds one etcd lease for as long as this node lives, so the keys put
// under it (a node's entry, the names it published in cluster namespaces) leave the
// directory by themselves within the lease's TTL once the node dies or is cut off.
//
// A thread of its own sends a keep-alive every third of the TTL, each on a short
// LeaseKeepAlive stream with a deadline (at most a third of the TTL), so a silent network
// cannot block it; with several etcd members, a member that does not answer is passed
// over for the next. The lease is
// lost, and on_lost runs once on the keeper's thread, when etcd says it is gone (expired or
// revoked) or when no keep-alive got through for a whole TTL: etcd has expired it, or will,
// and the node must record its keys again under a new lease. The keeper then stops. on_lost
// must not destroy the keeper (its destructor joins that thread).
//
// The destructor stops the thread (it does not wait for more than one call's deadline) and
// revokes the lease, best effort: an etcd it cannot reach expires the lease within its TTL.
// id() and ttl() may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/cluster/etcd_client.h"

namespace tensord::server::cluster {

class EtcdLeaseKeeper {
 public:
  using LostCallback = absl::AnyInvocable<void(absl::Status) &&>;

  // Grants a lease of ttl (at least 1 s) and starts keeping it; fails where the grant does.
  static absl::StatusOr<std::unique_ptr<EtcdLeaseKeeper>> Start(EtcdClient& etcd, absl::Duration ttl,
                                                                 LostCallback on_lost);
  ~EtcdLeaseKeeper();
  EtcdLeaseKeeper(const EtcdLeaseKeeper&) = delete;
  EtcdLeaseKeeper& operator=(const EtcdLeaseKeeper&) = delete;

  int64_t id() const { return grant_.id; }
  absl::Duration ttl() const { return grant_.ttl; }
  // The keep-alives that reached etcd so far.
  int64_t renewals() const;

 private:
  EtcdLeaseKeeper(EtcdClient& etcd, EtcdLeaseGrant grant, LostCallback on_lost);
  void Run();
  // One keep-alive; OK with etcd's TTL for the lease (0 or less: the lease is gone).
  absl::StatusOr<int64_t> KeepAliveOnce(absl::Time deadline);

  EtcdClient& etcd_;
  const EtcdLeaseGrant grant_;
  LostCallback on_lost_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  int64_t renewals_ ABSL_GUARDED_BY(mu_) = 0;
  // The call in flight, so that Stop can cancel it.
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace tensord::server::cluster
