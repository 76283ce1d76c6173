// PeerService: what this broker serves the other brokers of its cluster
// (tensord.cluster.v1.Peer, on --cluster-listen over mutual TLS). A read holds a lease on
// the tensor bound to the name (through the cluster's BrokerSession) and makes its buffer
// readable with one-sided UCX gets: each buffer is mapped and registered once (a whole
// arena once, for every tensor in it), and stays registered while any read of it is open.
//
// A read ends with CloseRead, when its reader leaves the directory (DropReadsOf: a reader
// killed mid-pull), or after its TTL (ExpireReads); then its lease goes, and the buffer's
// registration with its last read.
//
// A device tensor is served from a host copy: the staging helper (DeviceStager) copies it
// into host memory once the producer's ready fence has passed, and that copy is registered
// instead, shared by the concurrent reads of the tensor and gone with the last of them.
//
// Thread-safe; gRPC calls it on its own threads. The destructor ends every read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/memory/importer.h"
#include "server/cluster/broker_session.h"
#include "server/cluster/device_stager.h"
#include "server/cluster/ucx_worker.h"
#include "tensord/cluster/v1/cluster.grpc.pb.h"

namespace tensord::server::cluster {

class PeerService final : public tensord::cluster::v1::Peer::Service {
 public:
  PeerService(BrokerSession& session, UcxWorker& ucx, DeviceStager& stager,
              absl::Duration read_ttl = absl::Seconds(60));
  ~PeerService() override;

  grpc::Status OpenRead(grpc::ServerContext* context, const tensord::cluster::v1::OpenReadRequest* request,
                        tensord::cluster::v1::OpenReadResponse* response) override;
  grpc::Status CloseRead(grpc::ServerContext* context, const tensord::cluster::v1::CloseReadRequest* request,
                         tensord::cluster::v1::CloseReadResponse* response) override;
  grpc::Status CommitTake(grpc::ServerContext* context, const tensord::cluster::v1::CommitTakeRequest* request,
                          tensord::cluster::v1::CommitTakeResponse* response) override;

  // Ends the reads of a node that left the directory: those of the run of it `incarnation`
  // names (a node restarted under the same name may be reading already), or, with an empty
  // incarnation, every read of the node.
  void DropReadsOf(const std::string& node, const std::string& incarnation);
  // Ends the reads past their TTL.
  void ExpireReads();
  struct Counts {
    uint64_t reads_open = 0;          // now
    uint64_t buffers_registered = 0;  // now
    uint64_t reads_served = 0;        // closed by their readers, since start
    uint64_t bytes_served = 0;        // by those
  };
  Counts counts() const;

 private:
  // What a read reads: a host buffer (its id, and 0), or the host copy of a device tensor
  // (its buffer's id and the tensor's).
  using RegionKey = std::pair<uint64_t, uint64_t>;
  struct Region {
    std::unique_ptr<common::ImportedRegion> mapping;
    std::unique_ptr<UcxRegion> ucx;
    int reads = 0;
  };
  struct Read {
    std::string name;
    uint64_t generation = 0;
    uint64_t lease_id = 0;
    RegionKey region;
    uint64_t nbytes = 0;
    std::string node;
    std::string incarnation;
    absl::Time expires;
  };
  // Ends the reads for which ends(read_id, read) is true: their leases released, and the
  // registrations of buffers no read uses any more undone (on the UCX thread), outside the
  // lock. Returns how many ended.
  template <typename Pred>
  size_t EndReads(Pred ends);
  // Records the read of `lease` from `region` (a read of it counted) and fills in `response`.
  grpc::Status Opened(const tensord::cluster::v1::OpenReadRequest& request, const tensord::v1::AcquireResponse& lease,
                      const RegionKey& key, Region& region, tensord::cluster::v1::OpenReadResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The host copy of the device tensor a lease holds, made by the staging helper.
  absl::StatusOr<std::unique_ptr<common::ImportedRegion>> StageToHost(const tensord::v1::AcquireResponse& lease,
                                                                      const std::string& name);

  BrokerSession& session_;
  UcxWorker& ucx_;
  DeviceStager& stager_;
  const absl::Duration read_ttl_;
  mutable absl::Mutex mu_;
  uint64_t last_read_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Read> reads_ ABSL_GUARDED_BY(mu_);
  std::map<RegionKey, Region> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t reads_served_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_served_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tensord::server::cluster
