// ReplicaPuller: brings a tensor another node owns into this node's memory, bound here
// under its name: a replica. It asks the owner (Peer.OpenRead, over the peer channel) to
// hold the tensor and expose it, allocates the replica through the cluster's BrokerSession,
// reads the bytes with UCX gets in overlapped chunks straight into it, closes the read
// (the owner's lease goes), and publishes the replica; its memory is this node's from then
// on. Concurrent pulls of one name share one transfer: every caller gets its result.
//
// A device tensor (the owner serves a host copy of it) becomes a replica on the device of
// the same type and ordinal here: the bytes land in a host copy, which the staging helper
// (DeviceStager) copies to the replica's device before it is published. A node without
// that device refuses the pull (the broker's NOT_FOUND or FAILED_PRECONDITION, naming it).
//
// Replicas are tracked (Replica): ClusterNode unbinds one when the directory shows a newer
// publish of its name, or the name gone. Nothing is left on failure: the replica's memory
// is released, the owner's read closed (or ended by its TTL, or with this node's lease).
// Errors: UNAVAILABLE naming the owning node (unreachable, refused our certificate, died
// mid-read), NOT_FOUND (unbound on the owner meanwhile), and the broker's (quota).
//
// Thread-safe. Pulls run on the puller's threads; the destructor waits for them, and a
// pull asked for once it began is answered UNAVAILABLE.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "server/cluster/broker_session.h"
#include "server/cluster/device_stager.h"
#include "server/cluster/directory.h"
#include "server/cluster/ucx_worker.h"
#include "server/runtime/executor.h"
#include "tensord/cluster/v1/cluster.grpc.pb.h"

namespace tensord::server::cluster {

// Tag keys a replica carries: the node it came from and that node's generation of the name.
inline constexpr char kReplicaNodeTag[] = "tensord.cluster.node";
inline constexpr char kReplicaGenerationTag[] = "tensord.cluster.generation";

struct Replica {
  uint64_t tensor_id = 0;     // here
  uint64_t generation = 0;    // here
  std::string node;           // the owner
  uint64_t owner_generation = 0;
};

class ReplicaPuller {
 public:
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  struct Options {
    std::string node;         // this node, as owners see its reads
    std::string incarnation;  // this run of it (NodeRecord.incarnation)
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    std::string peer_name;  // what an owner's certificate must name; empty: its address
    absl::Duration call_timeout = absl::Seconds(5);
    // 16 MiB gets, 4 at once: the best of 2-64 MiB and 1-8 at once for 64 MiB tensors over
    // TCP (tests/bench/cluster_bench.py); a 64 MiB tensor is one round of gets.
    size_t chunk_bytes = 16 << 20;
    int in_flight = 4;
    absl::Duration read_timeout = absl::Seconds(60);
  };

  // Owners are found in the directory on `etcd` (LookUpName, ListNames).
  // Device tensors are read into host memory and copied to a device here by `stager`.
  ReplicaPuller(BrokerSession& session, UcxWorker& ucx, EtcdClient& etcd, DeviceStager& stager, Options options);
  ~ReplicaPuller();

  // Makes `name` bound here as the directory has it now; done runs once (see the header).
  void Pull(const std::string& name, Done done);
  // Moves one tensor another node has under `name_or_prefix` here (RemoteNames::FetchTake):
  // read into this node's memory first, then taken on its owner (CommitTake), then bound
  // here as this node's own; a tensor taken on its owner meanwhile is dropped and the next
  // one tried. Never shared with another call.
  void Take(const std::string& name_or_prefix, Done done);

  bool IsReplica(uint64_t tensor_id) const;
  std::optional<Replica> ReplicaOf(const std::string& name) const;
  std::map<std::string, Replica> Replicas() const;
  // The replica of `name` is unbound (or about to be): forgets it.
  void Forget(const std::string& name);
  // A node left: its UCX endpoint goes.
  void ForgetNode(const std::string& node);
  struct Counts {
    uint64_t replicas = 0;      // bound here now
    uint64_t pulls = 0;         // transfers that ran to the end (takes included)
    uint64_t bytes_pulled = 0;  // by those
    uint64_t pulls_failed = 0;  // transfers that failed (not those whose tensor went meanwhile)
  };
  Counts counts() const;

 private:
  // One transfer, on a puller thread; the status every waiter for `name` gets.
  absl::Status PullNow(const std::string& name);
  absl::Status TakeNow(const std::string& name_or_prefix);
  // Reads `name` from `owner` into new memory here and binds it: as a replica, or (take) as
  // this node's own once the owner let it be taken. ABORTED: taken on the owner meanwhile.
  absl::Status Transfer(const std::string& name, const tensord::cluster::v1::NameRecord& owner, bool take);
  // Counts a failed transfer (one whose tensor was taken or unbound meanwhile is not).
  absl::Status Counted(absl::Status transfer);
  tensord::cluster::v1::Peer::Stub& PeerFor(const std::string& address);

  BrokerSession& session_;
  UcxWorker& ucx_;
  EtcdClient& etcd_;
  DeviceStager& stager_;
  const Options options_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::vector<Done>> pulling_ ABSL_GUARDED_BY(mu_);  // by name: who waits
  std::map<std::string, Replica> replicas_ ABSL_GUARDED_BY(mu_);           // by name
  std::map<std::string, std::unique_ptr<tensord::cluster::v1::Peer::Stub>> peers_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // the destructor began: nothing new is posted
  uint64_t pulls_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_pulled_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pulls_failed_ ABSL_GUARDED_BY(mu_) = 0;
  // Used on the UCX thread only: a connection per owning node, to the worker address it gave.
  struct Endpoint {
    std::string worker_address;
    std::unique_ptr<UcxEndpoint> endpoint;
  };
  std::map<std::string, Endpoint> endpoints_;
  Executor threads_{4};  // last: its threads stop first
};

}  // namespace tensord::server::cluster
