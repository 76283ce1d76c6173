#include "server/cluster/broker_session.h"

#include <unistd.h>

#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/memory/backends.h"
#include "common/names.h"

namespace tensord::server::cluster {

namespace v1 = tensord::v1;

namespace {

absl::Status Naming(const absl::Status& status, const std::string& what) {
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace

// Drops the mapping of a recycled buffer the broker freed, so its memory can go.
class BrokerSession::Pushes final : public PushSink {
 public:
  explicit Pushes(BrokerSession* session) : session_(session) {}
  bool Push(const v1::SessionResponse& message) override {
    if (message.body_case() != v1::SessionResponse::kRecycledBufferFreed) return true;
    std::shared_ptr<const common::ImportedRegion> freed;  // unmapped outside the lock
    absl::MutexLock lock(&session_->mu_);
    auto it = session_->writable_.find(message.recycled_buffer_freed().buffer_id());
    if (it != session_->writable_.end()) {
      freed = std::move(it->second);
      session_->writable_.erase(it);
    }
    return true;
  }
  void Close() override {}

 private:
  BrokerSession* const session_;
};

absl::StatusOr<std::unique_ptr<BrokerSession>> BrokerSession::Open(Broker& broker, std::string client_name) {
  common::PeerCredentials self;
  self.uid = getuid();
  self.gid = getgid();
  self.pid = getpid();
  absl::StatusOr<v1::Welcome> welcome = broker.OpenSession(self, std::move(client_name));
  if (!welcome.ok()) return Naming(welcome.status(), "the cluster's session on this broker");
  std::unique_ptr<BrokerSession> session(new BrokerSession(broker, welcome->session_id()));
  session->pushes_ = std::make_shared<Pushes>(session.get());
  if (absl::StatusOr<bool> attached = broker.AttachSink(session->id(), session->pushes_); !attached.ok()) {
    return Naming(attached.status(), "the cluster's session on this broker");
  }
  return session;
}

BrokerSession::~BrokerSession() {
  broker_.DetachSink(session_id_, pushes_.get());
  broker_.CloseSession(session_id_);
}

absl::StatusOr<v1::AcquireResponse> BrokerSession::AcquireHere(const std::string& name) {
  // By the id bound to the name now: an acquire by name of a shared name not bound here
  // would ask the cluster (RemoteNames::Fetch), and this node serves only what it holds.
  v1::StatRequest stat;
  stat.set_name(name);
  absl::StatusOr<v1::StatResponse> bound = broker_.Stat(session_id_, stat);
  if (!bound.ok()) return bound.status();
  v1::AcquireRequest request;
  request.set_tensor_id(bound->tensor().tensor_id());
  std::promise<absl::StatusOr<v1::AcquireResponse>> answer;
  std::future<absl::StatusOr<v1::AcquireResponse>> result = answer.get_future();
  broker_.Acquire(session_id_, request,
                  [&answer](absl::StatusOr<v1::AcquireResponse> response) { answer.set_value(std::move(response)); });
  absl::StatusOr<v1::AcquireResponse> lease = result.get();
  // Rebound meanwhile to another tensor: that one is what the name holds now.
  if (lease.ok() && lease->tensor().name() != name) {
    Release(lease->lease_id());
    return absl::AbortedError(absl::StrCat(common::QuoteForError(name), " was rebound while being read; read it again"));
  }
  return lease;
}

absl::StatusOr<v1::AllocateResponse> BrokerSession::Allocate(const std::string& ns, const v1::TensorDesc& desc,
                                                             const std::map<std::string, std::string>& tags) {
  v1::AllocateRequest request;
  request.set_ns(ns);
  *request.mutable_desc() = desc;
  request.set_isolated(true);
  request.set_recyclable(true);
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [buffer_id, mapping] : writable_) request.add_reuse_buffer_ids(buffer_id);
  }
  for (const auto& [key, value] : tags) (*request.mutable_tags())[key] = value;
  std::promise<absl::StatusOr<v1::AllocateResponse>> answer;
  std::future<absl::StatusOr<v1::AllocateResponse>> result = answer.get_future();
  broker_.Allocate(session_id_, request,
                   [&answer](absl::StatusOr<v1::AllocateResponse> response) { answer.set_value(std::move(response)); });
  absl::StatusOr<v1::AllocateResponse> allocated = result.get();
  if (!allocated.ok()) return Naming(allocated.status(), absl::StrCat("allocate a replica in ", ns));
  return allocated;
}

absl::StatusOr<v1::TensorInfo> BrokerSession::Publish(uint64_t tensor_id, const std::string& name, bool replica) {
  v1::PublishRequest request;
  request.set_tensor_id(tensor_id);
  request.set_name(name);
  request.set_evictable(replica);
  absl::StatusOr<v1::PublishResponse> published = broker_.Publish(session_id_, request);
  if (!published.ok()) return Naming(published.status(), absl::StrCat("publish the replica of ", name));
  return published->tensor();
}

absl::StatusOr<std::vector<v1::TensorInfo>> BrokerSession::List(const std::string& prefix) {
  std::vector<v1::TensorInfo> listed;
  v1::ListRequest request;
  request.set_prefix(prefix);
  do {
    absl::StatusOr<v1::ListResponse> page = broker_.List(session_id_, request);
    if (!page.ok()) return Naming(page.status(), absl::StrCat("list ", prefix));
    for (v1::TensorInfo& tensor : *page->mutable_tensors()) listed.push_back(std::move(tensor));
    request.set_page_token(page->next_page_token());
  } while (!request.page_token().empty());
  return listed;
}

absl::Status BrokerSession::Delete(const std::string& name, uint64_t generation) {
  v1::DeleteRequest request;
  request.set_name(name);
  request.set_if_generation(generation);
  absl::StatusOr<v1::DeleteResponse> deleted = broker_.Delete(session_id_, request);
  return deleted.ok() ? absl::OkStatus() : deleted.status();
}

void BrokerSession::Release(uint64_t lease_id) {
  v1::ReleaseRequest request;
  request.add_lease_ids(lease_id);
  (void)broker_.Release(session_id_, request);
}

absl::StatusOr<std::shared_ptr<const common::ImportedRegion>> BrokerSession::MapForWriting(
    const v1::AllocateResponse& allocated) {
  const uint64_t buffer_id = allocated.tensor().buffer().buffer_id();
  {
    absl::MutexLock lock(&mu_);
    auto kept = writable_.find(buffer_id);
    if (kept != writable_.end()) return kept->second;  // a recycled buffer, mapped already
  }
  absl::StatusOr<std::unique_ptr<common::ImportedRegion>> mapped = Map(allocated.tensor(), /*writable=*/true);
  if (!mapped.ok()) return mapped.status();
  std::shared_ptr<const common::ImportedRegion> mapping = *std::move(mapped);
  if (allocated.recyclable()) {
    absl::MutexLock lock(&mu_);
    writable_[buffer_id] = mapping;
  }
  return mapping;
}

absl::StatusOr<Broker::FetchedHandle> BrokerSession::FetchHandle(const v1::TensorInfo& tensor) {
  const std::string what = absl::StrCat("tensor ", tensor.tensor_id(), " (buffer ", tensor.buffer().buffer_id(), ")");
  v1::FetchFd fetch;
  fetch.add_buffer_ids(tensor.buffer().buffer_id());
  absl::StatusOr<std::vector<Broker::FetchedHandle>> handles = broker_.FetchHandles(session_id_, fetch);
  if (!handles.ok()) return Naming(handles.status(), what);
  if (handles->empty()) return absl::InternalError(absl::StrCat(what, ": no handle came back"));
  return std::move(handles->front());
}

absl::StatusOr<std::unique_ptr<common::ImportedRegion>> BrokerSession::Map(const v1::TensorInfo& tensor,
                                                                           bool writable) {
  const std::string what = absl::StrCat("tensor ", tensor.tensor_id(), " (buffer ", tensor.buffer().buffer_id(), ")");
  absl::StatusOr<Broker::FetchedHandle> fetched = FetchHandle(tensor);
  if (!fetched.ok()) return fetched.status();
  Broker::FetchedHandle& handle = *fetched;
  absl::StatusOr<common::Importer*> importer = common::ProcessImporters().For(handle.device_type);
  if (!importer.ok()) return Naming(importer.status(), what);
  common::FetchedBuffer buffer;
  buffer.buffer_id = handle.buffer_id;
  buffer.size = handle.size;
  buffer.device_type = handle.device_type;
  buffer.handle = std::move(handle.handle);
  // Not populated up front: a replica's pages fault in as the network fills them, which on
  // a busy node overlaps with the transfer (measured with tests/bench/cluster_bench.py).
  buffer.populate = false;
  return (*importer)->Import(buffer, writable ? common::MapMode::kSharedWritable : common::MapMode::kSharedReadOnly,
                             what);
}

}  // namespace tensord::server::cluster
