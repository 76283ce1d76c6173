#include "client/client_core.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <span>
#include <utility>
#include <vector>

#include "client/process_hooks.h"
#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "client/watcher.h"
#include "common/protocol_limits.h"
#include "common/socket_paths.h"
#include "common/status.h"

namespace tensord::internal {
namespace {

Status AnnotatedFromAbsl(const absl::Status& status) { return FromAbsl(status); }

}  // namespace

std::string ResolveSocketPath(const ClientOptions& options) {
  return options.socket_path.empty() ? common::DefaultClientSocketPath() : options.socket_path;
}

Result<std::shared_ptr<ClientCore>> ClientCore::Create(const ClientOptions& given) {
  ClientOptions options = given;
  // Kept with the core, so a session opened again (after a fork) trusts the same uids.
  if (options.trusted_daemon_uids.empty()) {
    absl::StatusOr<std::vector<uint32_t>> from_environment = common::TrustedDaemonUidsFromEnvironment();
    if (!from_environment.ok()) return FromAbsl(from_environment.status());
    options.trusted_daemon_uids = *std::move(from_environment);
  }
  std::shared_ptr<ClientCore> core(new ClientCore(options, ResolveSocketPath(options)));
  absl::StatusOr<std::shared_ptr<Session>> session = Session::Open(options, core->socket_path_);
  if (!session.ok()) return FromAbsl(session.status());
  {
    PlainMutexLock lock(&core->mu_);
    core->session_ = *std::move(session);
  }
  // After gRPC is initialised (Session::Open made a channel), so the atexit hook runs
  // before gRPC's own static destructors.
  JoinProcessHooks(core.get());
  return core;
}

ClientCore::~ClientCore() {
  LeaveProcessHooks(this);
  std::shared_ptr<Session> session;
  std::vector<std::shared_ptr<const void>> sources;
  {
    PlainMutexLock lock(&mu_);
    session = std::move(session_);
    sources = std::move(lost_session_sources_);
  }
  // A watcher or a call in flight may keep the Session a little longer; the arena mappings
  // it keeps go now.
  if (session != nullptr) {
    session->ReleaseKeptMappings();
    std::vector<std::shared_ptr<const void>> held = session->TakeExportSources();
    sources.insert(sources.end(), std::make_move_iterator(held.begin()), std::make_move_iterator(held.end()));
  }
  // The Session's destructor stops its sender and closes the fd channel (the broker then
  // releases every lease of the session and retires its exports); views still held keep
  // their mappings.
  session.reset();
  // Then the memory of exports still held goes, under no lock (a source may be user code).
  sources.clear();
}

absl::StatusOr<std::shared_ptr<Session>> ClientCore::CurrentSession() {
  std::shared_ptr<Session> stale;  // destroyed outside the lock (it joins threads)
  PlainMutexLock lock(&mu_);
  if (exiting_) return absl::UnavailableError("the process is exiting");
  if (session_ != nullptr && !session_->dead()) return session_;
  stale = std::move(session_);
  if (stale != nullptr) {
    // A watcher may keep the dead session alive; its arena mappings are of no use any more.
    stale->ReleaseKeptMappings();
    // Moved, not dropped: nothing of a source runs under mu_.
    for (std::shared_ptr<const void>& source : stale->TakeExportSources()) {
      lost_session_sources_.push_back(std::move(source));
    }
  }
  TENSORD_ASSIGN_OR_RETURN(session_, Session::Open(options_, socket_path_));
  return session_;
}

bool ClientCore::LockForFork(std::chrono::steady_clock::time_point deadline) {
  mu_.Lock();
  return session_ == nullptr || session_->SuspendForFork(deadline);
}

void ClientCore::UnlockAfterForkInParent() {
  if (session_ != nullptr) session_->ResumeAfterFork();
  mu_.Unlock();
}

void ClientCore::ResetAfterForkInChild() {
  if (session_ != nullptr) {
    session_->AbandonInForkedChild();
    // Never destroyed: its destructor would join threads and tear down gRPC objects that
    // belong to the parent.
    new std::shared_ptr<Session>(std::move(session_));
  }
  // The parent's memory, as are the sources the abandoned Session keeps: never dropped here.
  if (!lost_session_sources_.empty()) {
    new std::vector<std::shared_ptr<const void>>(std::move(lost_session_sources_));
  }
  mu_.Unlock();
}

void ClientCore::ShutdownAtExit() {
  std::shared_ptr<Session> session;
  {
    PlainMutexLock lock(&mu_);
    exiting_ = true;
    session = session_;
  }
  if (session != nullptr) session->ShutdownAtExit();
}

uint64_t ClientCore::session_id() {
  absl::StatusOr<std::shared_ptr<Session>> session = CurrentSession();
  return session.ok() ? (*session)->session_id() : 0;
}

#define TENSORD_SESSION_OR_RETURN(var)                                        \
  absl::StatusOr<std::shared_ptr<Session>> var##_or = CurrentSession();      \
  if (!var##_or.ok()) return AnnotatedFromAbsl(var##_or.status());            \
  std::shared_ptr<Session> var = *std::move(var##_or)

#define TENSORD_CALL_OR_RETURN(var, session)                                   \
  absl::StatusOr<Session::RpcCall> var##_or = (session)->BeginCall();          \
  if (!var##_or.ok()) return AnnotatedFromAbsl(var##_or.status());             \
  Session::RpcCall var = *std::move(var##_or)

namespace {

Result<TensorRef> ToRef(absl::StatusOr<LeaseView*> view) {
  if (!view.ok()) return FromAbsl(view.status());
  return ClientCore::MakeRef(*view);
}

Result<std::vector<TensorRef>> ToRefs(absl::StatusOr<std::vector<LeaseView*>> views) {
  if (!views.ok()) return FromAbsl(views.status());
  std::vector<TensorRef> refs;
  refs.reserve(views->size());
  for (LeaseView* view : *views) refs.push_back(ClientCore::MakeRef(view));
  return refs;
}

// Acquired views: device ones are ordered on `stream` before the caller gets them; host
// ones have nothing to order and cost nothing here. A failure gives every reference back.
absl::Status OrderOnStream(std::span<LeaseView* const> views, uintptr_t stream) {
  for (LeaseView* view : views) {
    if (!view->stream_ordered()) continue;
    if (absl::Status ordered = view->UseOnStream(stream); !ordered.ok()) {
      for (LeaseView* each : views) each->Unref();
      return ordered;
    }
  }
  return absl::OkStatus();
}

Result<TensorRef> ToOrderedRef(absl::StatusOr<LeaseView*> view, uintptr_t stream) {
  if (view.ok()) {
    LeaseView* const one = *view;
    if (absl::Status ordered = OrderOnStream({&one, 1}, stream); !ordered.ok()) return FromAbsl(ordered);
  }
  return ToRef(std::move(view));
}

Result<std::vector<TensorRef>> ToOrderedRefs(absl::StatusOr<std::vector<LeaseView*>> views, uintptr_t stream) {
  if (views.ok()) {
    if (absl::Status ordered = OrderOnStream(*views, stream); !ordered.ok()) return FromAbsl(ordered);
  }
  return ToRefs(std::move(views));
}

}  // namespace

Result<TensorRef> ClientCore::Allocate(std::string_view ns, const TensorSpec& spec) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToRef(session->Allocate(ns, spec));
}

Result<TensorRef> ClientCore::Export(int memfd, uint64_t offset, std::string_view ns,
                                     const TensorSpec& spec) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToRef(session->Export(memfd, offset, ns, spec));
}

Result<TensorRef> ClientCore::ExportDevice(const void* device_ptr, std::string_view ns,
                                           const TensorSpec& spec, std::shared_ptr<const void> source) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToRef(session->ExportDevice(device_ptr, ns, spec, std::move(source)));
}

Result<TensorInfo> ClientCore::Publish(const TensorRef& tensor, std::string_view name,
                                       const PublishOptions& options) {
  LeaseView* view = ViewOf(tensor);
  if (view == nullptr) return Status(StatusCode::kInvalidArgument, "publish: an empty TensorRef");
  TENSORD_SESSION_OR_RETURN(session);
  absl::StatusOr<TensorInfo> info = session->Publish(*view, name, options);
  if (!info.ok()) return FromAbsl(info.status());
  return *std::move(info);
}

Status ClientCore::PublishNoWait(const TensorRef& tensor, std::string_view name,
                                 const PublishOptions& options) {
  LeaseView* view = ViewOf(tensor);
  if (view == nullptr) return Status(StatusCode::kInvalidArgument, "publish: an empty TensorRef");
  TENSORD_SESSION_OR_RETURN(session);
  return FromAbsl(session->PublishNoWait(*view, name, options));
}

Result<TensorRef> ClientCore::Acquire(const Session::Target& target, const AcquireOptions& options) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToOrderedRef(session->Acquire(target, options), options.stream);
}

Result<HandOverToken> ClientCore::HandOver(const TensorRef& tensor, std::chrono::milliseconds ttl) {
  LeaseView* view = ViewOf(tensor);
  if (view == nullptr) return Status(StatusCode::kInvalidArgument, "hand over: an empty TensorRef");
  TENSORD_SESSION_OR_RETURN(session);
  absl::StatusOr<HandOverToken> token = session->HandOver(*view, ttl);
  if (!token.ok()) return FromAbsl(token.status());
  return *std::move(token);
}

Result<TensorRef> ClientCore::Redeem(std::string_view token, const AcquireOptions& options) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToOrderedRef(session->Redeem(token, options), options.stream);
}

Result<CancelledHandOvers> ClientCore::CancelHandOvers(const std::vector<std::string>& tokens) {
  if (tokens.size() > common::kMaxCancelHandOversBatch) {
    return Status(StatusCode::kInvalidArgument,
                  "cancel hand-overs: " + std::to_string(tokens.size()) + " tokens; at most " +
                      std::to_string(common::kMaxCancelHandOversBatch) + " per call (none was cancelled)");
  }
  TENSORD_SESSION_OR_RETURN(session);
  tensord::v1::CancelHandOversRequest request;
  request.mutable_tokens()->Assign(tokens.begin(), tokens.end());
  tensord::v1::CancelHandOversResponse response;
  {
    TENSORD_CALL_OR_RETURN(call, session);
    grpc::Status status = call.stub()->CancelHandOvers(call.context(), request, &response);
    if (!status.ok()) return FromGrpc(status);
  }
  return CancelledHandOvers{response.cancelled(), response.not_found()};
}

Result<TensorRef> ClientCore::Take(std::string_view name_or_prefix, const TakeOptions& options) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToOrderedRef(session->Take(name_or_prefix, options), kLegacyDefaultStream);
}

Result<std::vector<TensorRef>> ClientCore::AllocateMany(const std::vector<AllocateItem>& items) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToRefs(session->AllocateMany(items));
}

Result<std::vector<TensorInfo>> ClientCore::PublishMany(const std::vector<PublishItem>& items) {
  std::vector<Session::PublishTarget> targets;
  targets.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    LeaseView* view = items[i].tensor != nullptr ? ViewOf(*items[i].tensor) : nullptr;
    if (view == nullptr) {
      return Status(StatusCode::kInvalidArgument,
                    "publish element " + std::to_string(i) + " of " +
                        std::to_string(items.size()) + " as '" + items[i].name +
                        "': an empty TensorRef");
    }
    targets.push_back(Session::PublishTarget{view, items[i].name, items[i].options});
  }
  TENSORD_SESSION_OR_RETURN(session);
  absl::StatusOr<std::vector<TensorInfo>> infos = session->PublishMany(targets);
  if (!infos.ok()) return FromAbsl(infos.status());
  return *std::move(infos);
}

Result<std::vector<TensorRef>> ClientCore::TakeMany(std::string_view name_or_prefix,
                                                    size_t max_count, const TakeOptions& options) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToOrderedRefs(session->TakeMany(name_or_prefix, max_count, options), kLegacyDefaultStream);
}

Result<std::vector<TensorRef>> ClientCore::AcquireMany(const std::vector<std::string>& names,
                                                       const AcquireOptions& options) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToOrderedRefs(session->AcquireMany(names, options), options.stream);
}

Status ClientCore::Delete(std::string_view name, uint64_t if_generation) {
  TENSORD_SESSION_OR_RETURN(session);
  tensord::v1::DeleteRequest request;
  request.set_name(std::string(name));
  request.set_if_generation(if_generation);
  tensord::v1::DeleteResponse response;
  grpc::Status status;
  {
    TENSORD_CALL_OR_RETURN(call, session);
    status = call.stub()->Delete(call.context(), request, &response);
  }
  // Whatever the outcome, a cached lease of the name must ask the broker again.
  session->ForgetName(name);
  return FromGrpc(status);
}

Result<TensorPage> ClientCore::ListPage(std::string_view prefix, const ListPageOptions& options) {
  TENSORD_SESSION_OR_RETURN(session);
  tensord::v1::ListRequest request;
  request.set_prefix(std::string(prefix));
  request.set_page_token(options.page_token);
  // Never 0, which asks the broker for an unpaged answer.
  request.set_page_size(static_cast<uint32_t>(
      options.limit == 0 ? common::kMaxListPageEntries : std::min(options.limit, common::kMaxListPageEntries)));
  tensord::v1::ListResponse response;
  {
    TENSORD_CALL_OR_RETURN(call, session);
    grpc::Status status = call.stub()->List(call.context(), request, &response);
    if (!status.ok()) return FromGrpc(status);
  }
  TensorPage page;
  page.tensors.reserve(static_cast<size_t>(response.tensors_size()));
  for (const tensord::v1::TensorInfo& t : response.tensors()) {
    absl::StatusOr<ValidatedTensor> valid = ValidateTensorInfo(t, "list entry '" + t.name() + "'");
    if (!valid.ok()) return FromAbsl(valid.status());
    page.tensors.push_back(std::move(valid->info));
  }
  page.next_page_token = std::move(*response.mutable_next_page_token());
  // A page that would not move the listing on would make List go round forever.
  if (!page.next_page_token.empty() &&
      (page.tensors.empty() || page.next_page_token <= options.page_token)) {
    return Status(StatusCode::kDataLoss, "list '" + std::string(prefix) + "': the broker's page after '" +
                                             options.page_token + "' does not move the listing on");
  }
  return page;
}

Result<std::vector<TensorInfo>> ClientCore::List(std::string_view prefix) {
  std::vector<TensorInfo> out;
  ListPageOptions options;
  do {
    Result<TensorPage> page = ListPage(prefix, options);
    if (!page.ok()) return page.status();
    if (out.empty()) {
      out = std::move(page->tensors);
    } else {
      out.insert(out.end(), std::make_move_iterator(page->tensors.begin()),
                 std::make_move_iterator(page->tensors.end()));
    }
    options.page_token = std::move(page->next_page_token);
  } while (!options.page_token.empty());
  return out;
}

Result<TensorStat> ClientCore::Stat(const Session::Target& target) {
  TENSORD_SESSION_OR_RETURN(session);
  tensord::v1::StatRequest request;
  if (const std::string* name = std::get_if<std::string>(&target)) {
    request.set_name(*name);
  } else {
    request.set_tensor_id(std::get<uint64_t>(target));
  }
  tensord::v1::StatResponse response;
  {
    TENSORD_CALL_OR_RETURN(call, session);
    grpc::Status status = call.stub()->Stat(call.context(), request, &response);
    if (!status.ok()) return FromGrpc(status);
  }
  absl::StatusOr<ValidatedTensor> valid = ValidateTensorInfo(response.tensor(), "stat");
  if (!valid.ok()) return FromAbsl(valid.status());
  TensorStat out;
  out.info = std::move(valid->info);
  for (const tensord::v1::LeaseHolder& h : response.holders()) {
    out.holders.push_back(ToPublicHolder(h));
  }
  return out;
}

Result<BrokerStatus> ClientCore::GetStatus(const StatusOptions& options) {
  TENSORD_SESSION_OR_RETURN(session);
  tensord::v1::StatusRequest request;
  request.set_include_sessions(options.sessions);
  tensord::v1::StatusResponse response;
  {
    TENSORD_CALL_OR_RETURN(call, session);
    grpc::Status status = call.stub()->Status(call.context(), request, &response);
    if (!status.ok()) return FromGrpc(status);
  }
  return ToPublicStatus(response);
}

Result<std::unique_ptr<Watcher>> ClientCore::Watch(std::string_view prefix, bool initial) {
  TENSORD_SESSION_OR_RETURN(session);
  absl::StatusOr<std::unique_ptr<Watcher>> watcher = WatcherImpl::Start(session, prefix, initial);
  if (!watcher.ok()) return FromAbsl(watcher.status());
  return *std::move(watcher);
}

Status ClientCore::Flush() {
  TENSORD_SESSION_OR_RETURN(session);
  return FromAbsl(session->Flush());
}

}  // namespace tensord::internal
