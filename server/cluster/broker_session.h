// BrokerSession: the cluster's own session on this node's broker, a plain user of the
// Broker's API as the transports are (credentials: the daemon's own, so no ACL or per-uid
// limit binds it). Each call waits for its answer; none may run on a broker thread or under
// a lock the broker's completions take. Memory is mapped through the importer of the
// buffer's device type (common/memory/importer.h), as a client maps it.
//
// Errors are the broker's, with what was asked in front. Thread-safe. The destructor closes
// the session, which releases every lease still held and frees its recycled buffers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/memory/importer.h"
#include "server/broker/broker.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::server::cluster {

class BrokerSession {
 public:
  static absl::StatusOr<std::unique_ptr<BrokerSession>> Open(Broker& broker, std::string client_name);
  ~BrokerSession();
  BrokerSession(const BrokerSession&) = delete;
  BrokerSession& operator=(const BrokerSession&) = delete;

  // A lease on the tensor bound to `name` here now: never a wait, never a fetch from the
  // cluster. ABORTED when the name was rebound between the lookup and the lease.
  absl::StatusOr<tensord::v1::AcquireResponse> AcquireHere(const std::string& name);
  // A writable tensor of `desc` in namespace `ns` on the device `desc` names, in a buffer
  // of its own: one of this session's recycled buffers when one fits (a host buffer's pages
  // are in memory already), else a new one.
  absl::StatusOr<tensord::v1::AllocateResponse> Allocate(const std::string& ns, const tensord::v1::TensorDesc& desc,
                                                         const std::map<std::string, std::string>& tags);
  // The writable mapping of a tensor Allocate made. A recyclable buffer's mapping is kept
  // for its next tensor until the broker frees the buffer (RecycledBufferFreed).
  absl::StatusOr<std::shared_ptr<const common::ImportedRegion>> MapForWriting(
      const tensord::v1::AllocateResponse& allocated);
  // `replica`: a copy of another node's tensor, which the broker may unbind to make room
  // while nothing holds it (PublishRequest.evictable); a later acquire pulls it again.
  absl::StatusOr<tensord::v1::TensorInfo> Publish(uint64_t tensor_id, const std::string& name, bool replica);
  // Every tensor bound here under a name that starts with `prefix`, page by page.
  absl::StatusOr<std::vector<tensord::v1::TensorInfo>> List(const std::string& prefix);
  // Unbinds `name` when it is bound at `generation` (0: whatever is bound).
  absl::Status Delete(const std::string& name, uint64_t generation);
  void Release(uint64_t lease_id);
  // The handle of the buffer of a tensor this session leases, as a client fetches it.
  absl::StatusOr<Broker::FetchedHandle> FetchHandle(const tensord::v1::TensorInfo& tensor);
  // Maps the buffer of a tensor this session leases: read-only, or writable (the producer's
  // mapping, for a tensor it allocated).
  absl::StatusOr<std::unique_ptr<common::ImportedRegion>> Map(const tensord::v1::TensorInfo& tensor, bool writable);

  uint64_t id() const { return session_id_; }

 private:
  class Pushes;  // the broker's pushes to this session: recycled buffers freed
  BrokerSession(Broker& broker, uint64_t session_id) : broker_(broker), session_id_(session_id) {}
  Broker& broker_;
  const uint64_t session_id_;
  std::shared_ptr<Pushes> pushes_;
  absl::Mutex mu_;
  // Recyclable buffers this session allocated, by id: their writable mappings.
  std::map<uint64_t, std::shared_ptr<const common::ImportedRegion>> writable_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::server::cluster
