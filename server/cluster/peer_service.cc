#include "server/cluster/peer_service.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace tensord::server::cluster {

namespace v1 = tensord::v1;
namespace cv1 = tensord::cluster::v1;

namespace {

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace

PeerService::PeerService(BrokerSession& session, UcxWorker& ucx, DeviceStager& stager, absl::Duration read_ttl)
    : session_(session), ucx_(ucx), stager_(stager), read_ttl_(read_ttl) {}

PeerService::~PeerService() {
  EndReads([](uint64_t, const Read&) { return true; });
}

absl::StatusOr<std::unique_ptr<common::ImportedRegion>> PeerService::StageToHost(const v1::AcquireResponse& lease,
                                                                                 const std::string& name) {
  const v1::TensorInfo& tensor = lease.tensor();
  const uint64_t nbytes = tensor.buffer().extent();
  TENSORD_ASSIGN_OR_RETURN(std::unique_ptr<HostCopy> copy, HostCopy::Make(nbytes, name));
  TENSORD_ASSIGN_OR_RETURN(Broker::FetchedHandle handle, session_.FetchHandle(tensor));
  const DeviceBuffer buffer{.device_type = handle.device_type, .size = handle.size, .handle = &handle.handle};
  const absl::Time started = absl::Now();
  TENSORD_RETURN_IF_ERROR(
      stager_.ToHost(buffer, tensor.buffer().offset(), nbytes, lease.ready_fence(), copy->fd(), name));
  spdlog::debug("cluster: staged {} ({} bytes of device memory) in host memory in {:.1f} ms", name, nbytes,
                absl::ToDoubleMilliseconds(absl::Now() - started));
  return std::unique_ptr<common::ImportedRegion>(std::move(copy));
}

grpc::Status PeerService::OpenRead(grpc::ServerContext*, const cv1::OpenReadRequest* request,
                                   cv1::OpenReadResponse* response) {
  absl::StatusOr<v1::AcquireResponse> lease = session_.AcquireHere(request->name());
  if (!lease.ok()) return ToGrpc(lease.status());
  const v1::TensorInfo& tensor = lease->tensor();
  const bool staged = tensor.desc().device().type() != v1::DEVICE_TYPE_CPU;
  const RegionKey key{tensor.buffer().buffer_id(), staged ? tensor.tensor_id() : 0};
  // A device tensor's host copy is made outside the lock (a copy takes a while); a read of
  // the same tensor that made one meanwhile wins, and this one is dropped.
  std::unique_ptr<common::ImportedRegion> copy;
  for (;;) {
    if (staged && copy == nullptr) {
      bool have = false;
      {
        absl::MutexLock lock(&mu_);
        have = regions_.contains(key);
      }
      if (!have) {
        absl::StatusOr<std::unique_ptr<common::ImportedRegion>> made = StageToHost(*lease, request->name());
        if (!made.ok()) {
          session_.Release(lease->lease_id());
          return ToGrpc(made.status());
        }
        copy = *std::move(made);
      }
    }
    absl::MutexLock lock(&mu_);
    auto region = regions_.find(key);
    // The reads that shared a host copy ended between the two looks: this read makes one.
    if (region == regions_.end() && staged && copy == nullptr) continue;
    if (region == regions_.end()) {
      absl::StatusOr<std::unique_ptr<common::ImportedRegion>> mapping =
          staged ? absl::StatusOr<std::unique_ptr<common::ImportedRegion>>(std::move(copy))
                 : session_.Map(tensor, /*writable=*/false);
      absl::StatusOr<std::unique_ptr<UcxRegion>> registered =
          !mapping.ok() ? absl::StatusOr<std::unique_ptr<UcxRegion>>(mapping.status())
                        : ucx_.Call([&](UcxNode& node) {
                            return UcxRegion::Register(node, (*mapping)->data(), (*mapping)->size());
                          });
      if (!registered.ok()) {
        session_.Release(lease->lease_id());
        return ToGrpc(registered.status());
      }
      region = regions_.emplace(key, Region{*std::move(mapping), *std::move(registered), 0}).first;
    }
    return Opened(*request, *lease, key, region->second, response);
  }
}

grpc::Status PeerService::Opened(const cv1::OpenReadRequest& request, const v1::AcquireResponse& lease,
                                 const RegionKey& key, Region& region, cv1::OpenReadResponse* response) {
  const v1::TensorInfo& tensor = lease.tensor();
  const bool staged = key.second != 0;
  ++region.reads;
  const uint64_t read_id = ++last_read_id_;
  reads_[read_id] = Read{.name = request.name(),
                         .generation = tensor.generation(),
                         .lease_id = lease.lease_id(),
                         .region = key,
                         .nbytes = tensor.buffer().extent(),
                         .node = request.reader_node(),
                         .incarnation = request.reader_incarnation(),
                         .expires = absl::Now() + read_ttl_};
  response->set_read_id(read_id);
  response->set_tensor_id(tensor.tensor_id());
  response->set_generation(tensor.generation());
  *response->mutable_desc() = tensor.desc();
  *response->mutable_tags() = tensor.tags();
  response->set_nbytes(tensor.buffer().extent());
  response->set_worker_address(ucx_.address());
  // A host copy holds the tensor alone, from its start.
  response->set_remote_address(region.ucx->address() + (staged ? 0 : tensor.buffer().offset()));
  response->set_packed_key(region.ucx->packed_key());
  response->set_ttl_ms(absl::ToInt64Milliseconds(read_ttl_));
  return grpc::Status::OK;
}

grpc::Status PeerService::CloseRead(grpc::ServerContext*, const cv1::CloseReadRequest* request,
                                    cv1::CloseReadResponse*) {
  const uint64_t read_id = request->read_id();
  uint64_t nbytes = 0;
  if (EndReads([read_id, &nbytes](uint64_t id, const Read& read) {
        if (id != read_id) return false;
        nbytes = read.nbytes;
        return true;
      }) == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no read ", read_id, " is open"));
  }
  absl::MutexLock lock(&mu_);
  ++reads_served_;
  bytes_served_ += nbytes;
  return grpc::Status::OK;
}

grpc::Status PeerService::CommitTake(grpc::ServerContext*, const cv1::CommitTakeRequest* request,
                                     cv1::CommitTakeResponse*) {
  std::string name;
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    auto read = reads_.find(request->read_id());
    if (read == reads_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no read ", request->read_id(), " is open"));
    }
    name = read->second.name;
    generation = read->second.generation;
  }
  // The broker decides: whoever unbinds the name first, here or on another node, took it.
  return ToGrpc(session_.Delete(name, generation));
}

void PeerService::DropReadsOf(const std::string& node, const std::string& incarnation) {
  EndReads([&](uint64_t, const Read& read) {
    return read.node == node && (incarnation.empty() || read.incarnation == incarnation);
  });
}

void PeerService::ExpireReads() {
  const absl::Time now = absl::Now();
  EndReads([now](uint64_t, const Read& read) { return read.expires <= now; });
}

PeerService::Counts PeerService::counts() const {
  absl::MutexLock lock(&mu_);
  return Counts{.reads_open = reads_.size(), .buffers_registered = regions_.size(), .reads_served = reads_served_,
                .bytes_served = bytes_served_};
}

template <typename Pred>
size_t PeerService::EndReads(Pred ends) {
  std::vector<uint64_t> leases;
  std::vector<Region> unused;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = reads_.begin(); it != reads_.end();) {
      if (!ends(it->first, it->second)) {
        ++it;
        continue;
      }
      leases.push_back(it->second.lease_id);
      auto region = regions_.find(it->second.region);
      if (region != regions_.end() && --region->second.reads == 0) {
        unused.push_back(std::move(region->second));
        regions_.erase(region);
      }
      it = reads_.erase(it);
    }
  }
  if (!unused.empty()) {
    // Registrations are undone on the thread that drives the worker, before the unmapping.
    ucx_.Call([&unused](UcxNode&) {
      for (Region& region : unused) region.ucx.reset();
    });
    unused.clear();
  }
  for (uint64_t lease : leases) session_.Release(lease);
  return leases.size();
}

}  // namespace tensord::server::cluster
