// ClusterNode: this daemon as one node of a cluster of tensord brokers, composed of its
// parts, each with its own contract:
//   Directory       this node and the names it publishes, on etcd under its lease
//   PeerService     what other brokers read here (leases held for their pulls), over gRPC
//                   with mutual TLS on --cluster-listen, bytes by UCX gets
//   ReplicaPuller   names other nodes own, pulled into replicas here
//   BrokerSession   the cluster's own session on the local broker
//   UcxWorker       the thread that drives UCX
// It is the broker's RemoteNames (an acquire of a shared name not bound here fetches it),
// and a watcher of the broker's shared namespaces (a publish there is recorded in the
// directory, an unbind withdrawn). Names outside the shared namespaces never leave the node.
//
// From the directory it keeps replicas honest: a newer publish of a name anywhere, or the
// name gone from the directory, unbinds the replica here (leases on it stay valid). A
// publish elsewhere of a name that a local acquire waits for, or a local watcher watches,
// is pulled at once; one that a local take waits for is moved here (taken on its owner).
//
// Start() never waits for etcd: the node joins when etcd answers (Directory). Stop() (or
// the destructor) leaves: the broker stops fetching, the listener stops, reads and pulls
// end, and the node's names leave the directory.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "server/broker/broker.h"
#include "server/broker/remote_names.h"
#include "server/cluster/broker_session.h"
#include "server/cluster/directory.h"
#include "server/cluster/etcd_client.h"
#include "server/cluster/peer_service.h"
#include "server/cluster/peer_tls.h"
#include "server/cluster/replica_puller.h"
#include "server/cluster/device_stager.h"
#include "server/cluster/ucx_worker.h"
#include "server/runtime/executor.h"

namespace tensord::server::cluster {

struct ClusterOptions {
  std::vector<std::string> etcd_endpoints;
  std::string node;
  std::string listen;                   // HOST:PORT other brokers reach this one at
  std::vector<std::string> namespaces;  // shared across the cluster
  TlsFiles tls;
  // The name peers' certificates are checked for; empty: the address they are reached at.
  std::string peer_name;
  absl::Duration lease_ttl = absl::Seconds(10);
  std::string version;
  // The staging helper program (tensord-stage), through which device tensors cross nodes;
  // the daemon's is the one beside its own binary.
  std::string stage_helper;
};

class ClusterNode final : public RemoteNames {
 public:
  // Checks the settings, reads the TLS files, starts UCX and the peer listener, and starts
  // joining the directory. INVALID_ARGUMENT naming a bad setting; UNAVAILABLE when the
  // listener cannot bind or UCX cannot start.
  static absl::StatusOr<std::unique_ptr<ClusterNode>> Start(Broker& broker, ClusterOptions options);
  ~ClusterNode() override;
  ClusterNode(const ClusterNode&) = delete;
  ClusterNode& operator=(const ClusterNode&) = delete;

  void Stop();

  // This node's section of the daemon's status: its settings, whether it has joined, and
  // what it pulled and served. Thread-safe; once Stop() began, the settings alone.
  void Describe(tensord::v1::ClusterStatus& status) const;

  // RemoteNames.
  bool Shares(std::string_view name) const override;
  void Fetch(const std::string& name, FetchDone done) override;
  void FetchTake(const std::string& name_or_prefix, FetchDone done) override;

 private:
  class BoundNames;  // the broker's watch sink
  ClusterNode(Broker& broker, ClusterOptions options) : broker_(broker), options_(std::move(options)) {}
  absl::Status Init();
  // Directory events (the watch's thread).
  void OnNameRecorded(const std::string& name, const tensord::cluster::v1::NameRecord& record,
                      std::optional<uint64_t> superseded);
  void OnNameRemoved(const std::string& name);
  void OnResynced(const std::map<std::string, tensord::cluster::v1::NameRecord>& names);
  // Local binds and unbinds of shared names (in order, on events_).
  void OnBound(const tensord::v1::WatchEvent& event);
  void OnUnbound(const tensord::v1::WatchEvent& event);
  // Once Stop() began: answers `done` UNAVAILABLE and returns true.
  bool AnswerIfLeaving(FetchDone& done);
  // Replicas bound before this node started (kept by a take-over restart) are no longer
  // tracked, so nothing would keep them current: they are unbound, to be pulled again.
  void DropInheritedReplicas();
  // Unbinds the replica of `name` here, if there is one.
  void DropReplica(const std::string& name, const char* why);
  void Maintain();

  Broker& broker_;
  const ClusterOptions options_;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<UcxWorker> ucx_;
  std::unique_ptr<DeviceStager> stager_;
  std::unique_ptr<BrokerSession> session_;
  std::unique_ptr<PeerService> peer_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Directory> directory_;
  std::unique_ptr<ReplicaPuller> puller_;
  std::vector<uint64_t> watchers_;
  std::unique_ptr<Executor> events_;  // local binds and unbinds, one at a time, in order
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::thread maintenance_;  // expires peers' reads
};

}  // namespace tensord::server::cluster
