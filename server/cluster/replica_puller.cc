#include "server/cluster/replica_puller.h"

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "grpcpp/create_channel.h"
#include "spdlog/spdlog.h"

namespace tensord::server::cluster {

namespace v1 = tensord::v1;
namespace cv1 = tensord::cluster::v1;

namespace {

std::string NodeWhere(const cv1::NameRecord& owner) {
  return absl::StrCat("node ", owner.node(), " (", owner.broker_address(), ")");
}

// A peer's gRPC failure, as the acquire reports it: NOT_FOUND stays (unbound meanwhile);
// every other failure makes the owner unavailable.
absl::Status PeerError(const cv1::NameRecord& owner, const char* call, const grpc::Status& status) {
  std::string message = absl::StrCat(NodeWhere(owner), ": ", call, ": ", status.error_message());
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    absl::StrAppend(&message, " (no answer in time: the node is unreachable, or one side refused the other's "
                              "certificate; the daemon's log has gRPC's reason)");
  }
  switch (status.error_code()) {
    case grpc::StatusCode::NOT_FOUND: return absl::NotFoundError(message);
    case grpc::StatusCode::ABORTED: return absl::AbortedError(message);
    case grpc::StatusCode::FAILED_PRECONDITION: return absl::FailedPreconditionError(message);
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return absl::ResourceExhaustedError(message);
    default: return absl::UnavailableError(message);
  }
}

}  // namespace

ReplicaPuller::ReplicaPuller(BrokerSession& session, UcxWorker& ucx, EtcdClient& etcd, DeviceStager& stager,
                             Options options)
    : session_(session), ucx_(ucx), etcd_(etcd), stager_(stager), options_(std::move(options)) {}

ReplicaPuller::~ReplicaPuller() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;  // what was posted before runs; nothing is posted after
  }
  threads_.Shutdown();
  ucx_.Call([this](UcxNode&) { endpoints_.clear(); });
}

void ReplicaPuller::Pull(const std::string& name, Done done) {
  absl::ReleasableMutexLock lock(&mu_);
  if (closing_) {
    lock.Release();
    std::move(done)(absl::UnavailableError("cluster: this node is leaving the cluster"));
    return;
  }
  std::vector<Done>& waiting = pulling_[name];
  waiting.push_back(std::move(done));
  if (waiting.size() > 1) return;  // joins the pull under way
  threads_.Post([this, name] {
    absl::Status status = PullNow(name);
    std::vector<Done> waiting;
    {
      absl::MutexLock lock(&mu_);
      waiting = std::move(pulling_[name]);
      pulling_.erase(name);
    }
    // Each waiter gets a status of its own: they end on threads of their own.
    for (Done& done : waiting) std::move(done)(absl::Status(status.code(), status.message()));
  });
}

absl::Status ReplicaPuller::PullNow(const std::string& name) {
  absl::StatusOr<cv1::NameRecord> owner = LookUpName(etcd_, name);
  if (!owner.ok()) return owner.status();
  if (owner->node() == options_.node) return absl::OkStatus();  // ours: bound here, or gone
  if (std::optional<Replica> replica = ReplicaOf(name);
      replica && replica->node == owner->node() && replica->owner_generation == owner->generation()) {
    return absl::OkStatus();  // pulled by an earlier transfer
  }
  return Counted(Transfer(name, *owner, /*take=*/false));
}

absl::Status ReplicaPuller::Counted(absl::Status transfer) {
  if (!transfer.ok() && transfer.code() != absl::StatusCode::kAborted &&
      transfer.code() != absl::StatusCode::kNotFound) {
    absl::MutexLock lock(&mu_);
    ++pulls_failed_;
  }
  return transfer;
}

void ReplicaPuller::Take(const std::string& name_or_prefix, Done done) {
  absl::ReleasableMutexLock lock(&mu_);
  if (closing_) {
    lock.Release();
    std::move(done)(absl::UnavailableError("cluster: this node is leaving the cluster"));
    return;
  }
  threads_.Post([this, name_or_prefix, done = std::move(done)]() mutable {
    std::move(done)(TakeNow(name_or_prefix));
  });
}

absl::Status ReplicaPuller::TakeNow(const std::string& name_or_prefix) {
  std::vector<ListedName> candidates;
  if (name_or_prefix.ends_with('/')) {
    absl::StatusOr<std::vector<ListedName>> listed = ListNames(etcd_, options_.node, name_or_prefix);
    if (!listed.ok()) return listed.status();
    candidates = *std::move(listed);
  } else {
    absl::StatusOr<cv1::NameRecord> owner = LookUpName(etcd_, name_or_prefix);
    if (!owner.ok()) return owner.status();
    if (owner->node() != options_.node) candidates.push_back({name_or_prefix, *owner});
  }
  // Oldest first; one taken elsewhere meanwhile makes way for the next.
  constexpr size_t kMostTries = 16;
  for (size_t i = 0; i < candidates.size() && i < kMostTries; ++i) {
    absl::Status moved = Counted(Transfer(candidates[i].name, candidates[i].record, /*take=*/true));
    if (moved.code() != absl::StatusCode::kAborted && moved.code() != absl::StatusCode::kNotFound) return moved;
  }
  return absl::NotFoundError(absl::StrCat("no other node of the cluster has anything bound ",
                                          name_or_prefix.ends_with('/') ? "under " : "to ",
                                          common::QuoteForError(name_or_prefix)));
}

cv1::Peer::Stub& ReplicaPuller::PeerFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<cv1::Peer::Stub>& stub = peers_[address];
  if (stub == nullptr) {
    // A node that restarts is back within a second or two: retry its address that often,
    // not after gRPC's default backoff of up to two minutes.
    grpc::ChannelArguments arguments;
    arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    if (!options_.peer_name.empty()) arguments.SetSslTargetNameOverride(options_.peer_name);
    arguments.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);  // as for etcd (etcd_client.cc): callers retry
    stub = cv1::Peer::NewStub(grpc::CreateCustomChannel(address, options_.credentials, arguments));
  }
  return *stub;
}

absl::Status ReplicaPuller::Transfer(const std::string& name, const cv1::NameRecord& owner, bool take) {
  cv1::Peer::Stub& peer = PeerFor(owner.broker_address());
  cv1::OpenReadRequest open;
  open.set_name(name);
  open.set_reader_node(options_.node);
  open.set_reader_incarnation(options_.incarnation);
  cv1::OpenReadResponse read;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
    // Rides out a reconnect (the owner restarted, the channel is backing off) within the
    // deadline, rather than failing at once.
    context.set_wait_for_ready(true);
    grpc::Status opened = peer.OpenRead(&context, open, &read);
    if (!opened.ok()) return PeerError(owner, "open a read", opened);
  }
  // The owner's lease goes when the read closes, whatever happens here.
  auto close_now = [&] {
    cv1::CloseReadRequest close;
    close.set_read_id(read.read_id());
    cv1::CloseReadResponse closed;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
    return peer.CloseRead(&context, close, &closed);
  };
  absl::Cleanup close_read = [&] {
    if (grpc::Status status = close_now(); !status.ok()) {
      spdlog::debug("cluster: close read {} on {}: {}", read.read_id(), NodeWhere(owner), status.error_message());
    }
  };
  spdlog::debug("cluster: pulling {} from {} ({} bytes, generation {})", name, NodeWhere(owner), read.nbytes(),
                read.generation());
  const absl::Time started = absl::Now();
  std::map<std::string, std::string> tags(read.tags().begin(), read.tags().end());
  tags[kReplicaNodeTag] = owner.node();
  tags[kReplicaGenerationTag] = absl::StrCat(read.generation());
  // A device tensor's replica goes on this node's device of the same type and ordinal (the
  // owner's device UUID names a device of the owner's node).
  v1::TensorDesc desc = read.desc();
  const bool on_device = desc.device().type() != v1::DEVICE_TYPE_CPU;
  if (on_device) desc.mutable_device()->clear_uuid();
  absl::StatusOr<v1::AllocateResponse> replica = session_.Allocate(std::string(common::NamespaceOf(name)), desc, tags);
  if (!replica.ok() && on_device &&
      (replica.status().code() == absl::StatusCode::kNotFound ||
       replica.status().code() == absl::StatusCode::kFailedPrecondition)) {
    // Not "no such name": the name is there, and this node has no device to copy it to.
    return absl::FailedPreconditionError(absl::StrCat(name, " is device memory on ", NodeWhere(owner),
                                                      ", and this node cannot hold a replica of it: ",
                                                      replica.status().message()));
  }
  if (!replica.ok()) return replica.status();
  absl::Cleanup release = [&] { session_.Release(replica->lease_id()); };
  const v1::TensorInfo& tensor = replica->tensor();
  if (tensor.buffer().extent() < read.nbytes()) {
    return absl::InternalError(absl::StrCat("the replica of ", name, " has room for ", tensor.buffer().extent(),
                                            " bytes, the owner sends ", read.nbytes()));
  }
  // Where the bytes land: the replica's own memory, or a host copy of them for its device.
  std::shared_ptr<HostCopy> staged;
  absl::StatusOr<std::shared_ptr<const common::ImportedRegion>> mapping;
  if (on_device) {
    absl::StatusOr<std::unique_ptr<HostCopy>> made = HostCopy::Make(read.nbytes(), name);
    if (!made.ok()) return made.status();
    staged = *std::move(made);
    mapping = staged;
  } else {
    mapping = session_.MapForWriting(*replica);
  }
  if (!mapping.ok()) return mapping.status();
  uint8_t* into = (*mapping)->data() + (on_device ? 0 : tensor.buffer().offset());
  const absl::Time allocated = absl::Now();
  const std::string peer_name = NodeWhere(owner);
  absl::Status copied = ucx_.Call([&](UcxNode& node) -> absl::Status {
    Endpoint& endpoint = endpoints_[owner.node()];
    if (endpoint.endpoint == nullptr || endpoint.worker_address != read.worker_address()) {
      endpoint.endpoint.reset();
      absl::StatusOr<std::unique_ptr<UcxEndpoint>> connected =
          UcxEndpoint::Connect(node, read.worker_address(), peer_name);
      if (!connected.ok()) return connected.status();
      endpoint = Endpoint{read.worker_address(), *std::move(connected)};
    }
    UcxEndpoint::ReadOptions options;
    options.chunk_bytes = options_.chunk_bytes;
    options.in_flight = options_.in_flight;
    options.timeout = options_.read_timeout;
    absl::Status status =
        endpoint.endpoint->Read(into, read.nbytes(), read.remote_address(), read.packed_key(), options);
    if (!status.ok()) endpoints_.erase(owner.node());  // broken for good: connect again next time
    return status;
  });
  mapping->reset();  // this transfer's hold on the writable mapping: the bytes are in
  spdlog::debug("cluster: {}: allocated and mapped in {:.1f} ms, read in {:.1f} ms", name,
                absl::ToDoubleMilliseconds(allocated - started), absl::ToDoubleMilliseconds(absl::Now() - allocated));
  if (!copied.ok()) {
    return absl::Status(copied.code(), absl::StrCat("pull ", name, " from ", peer_name, ": ", copied.message()));
  }
  if (on_device) {
    // Before a take commits: a copy that fails here leaves the tensor on its owner.
    absl::StatusOr<Broker::FetchedHandle> handle = session_.FetchHandle(tensor);
    if (!handle.ok()) return handle.status();
    const DeviceBuffer buffer{.device_type = handle->device_type, .size = handle->size, .handle = &handle->handle};
    const absl::Time landed = absl::Now();
    if (absl::Status moved = stager_.ToDevice(buffer, tensor.buffer().offset(), read.nbytes(), staged->fd(), name);
        !moved.ok()) {
      return moved;
    }
    staged.reset();
    spdlog::debug("cluster: {}: copied to its device in {:.1f} ms", name,
                  absl::ToDoubleMilliseconds(absl::Now() - landed));
  }
  // The bytes are the tensor's only if the owner held the read, and so the registration of
  // its memory, to the end of the gets: a read it ended early (its TTL ran out, or it took
  // this node for gone) may have been read from memory no longer registered. A take's
  // CommitTake finds the read still open, or refuses; a replica's read must close cleanly.
  if (take) {
    cv1::CommitTakeRequest commit;
    commit.set_read_id(read.read_id());
    cv1::CommitTakeResponse committed;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
    if (grpc::Status status = peer.CommitTake(&context, commit, &committed); !status.ok()) {
      if (status.error_code() == grpc::StatusCode::ABORTED || status.error_code() == grpc::StatusCode::NOT_FOUND) {
        return absl::AbortedError(absl::StrCat(name, " was taken on ", NodeWhere(owner), " meanwhile"));
      }
      // Unknown whether the owner unbound it: the copy here is kept rather than lost, bound
      // as this node's own (at worst the tensor is then bound on two nodes, never on none).
      spdlog::warn("cluster: take {} from {}: {}; keeping the copy read here", name, NodeWhere(owner),
                   status.error_message());
    }
    absl::StatusOr<v1::TensorInfo> published = session_.Publish(tensor.tensor_id(), name, /*replica=*/false);
    if (!published.ok()) return published.status();
    spdlog::info("cluster: took {} from {}: {} bytes", name, NodeWhere(owner), read.nbytes());
    return absl::OkStatus();
  }
  std::move(close_read).Cancel();
  if (grpc::Status closed = close_now(); !closed.ok()) {
    return absl::UnavailableError(absl::StrCat("pull ", name, " from ", peer_name,
                                               ": the owner did not hold the read to the end (",
                                               closed.error_message(), "); the copy is dropped"));
  }
  {
    absl::MutexLock lock(&mu_);
    replicas_[name] = Replica{tensor.tensor_id(), 0, owner.node(), read.generation()};
  }
  absl::StatusOr<v1::TensorInfo> published = session_.Publish(tensor.tensor_id(), name, /*replica=*/true);
  if (!published.ok()) {
    Forget(name);
    return published.status();
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = replicas_.find(name);
    if (it != replicas_.end() && it->second.tensor_id == tensor.tensor_id()) it->second.generation = published->generation();
    ++pulls_;
    bytes_pulled_ += read.nbytes();
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  spdlog::info("cluster: pulled {} from {}: {} bytes in {:.1f} ms ({:.0f} MB/s)", name, NodeWhere(owner),
               read.nbytes(), seconds * 1e3, seconds > 0 ? read.nbytes() / seconds / 1e6 : 0.0);
  // A newer publish recorded while this one was read may have been seen before the
  // replica was bound here: check once more, and drop what is stale already.
  absl::StatusOr<cv1::NameRecord> now = LookUpName(etcd_, name);
  if (now.ok() && (now->node() != owner.node() || now->generation() != read.generation())) {
    Forget(name);
    (void)session_.Delete(name, published->generation());
  }
  return absl::OkStatus();
}

bool ReplicaPuller::IsReplica(uint64_t tensor_id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, replica] : replicas_) {
    if (replica.tensor_id == tensor_id) return true;
  }
  return false;
}

std::optional<Replica> ReplicaPuller::ReplicaOf(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = replicas_.find(name);
  if (it == replicas_.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, Replica> ReplicaPuller::Replicas() const {
  absl::MutexLock lock(&mu_);
  return replicas_;
}

void ReplicaPuller::Forget(const std::string& name) {
  absl::MutexLock lock(&mu_);
  replicas_.erase(name);
}

void ReplicaPuller::ForgetNode(const std::string& node) {
  ucx_.Post([this, node](UcxNode&) { endpoints_.erase(node); });
}

ReplicaPuller::Counts ReplicaPuller::counts() const {
  absl::MutexLock lock(&mu_);
  return Counts{.replicas = replicas_.size(), .pulls = pulls_, .bytes_pulled = bytes_pulled_,
                .pulls_failed = pulls_failed_};
}

}  // namespace tensord::server::cluster
