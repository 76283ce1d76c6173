#include "client/session.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "client/cancel_state.h"
#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "common/fd_channel.h"
#include "common/logging.h"
#include "common/memory/backends.h"
#include "common/socket_paths.h"
#include "common/status.h"

namespace tensord::internal {
namespace {

std::string DefaultClientName() { return program_invocation_short_name; }

// How a publish is named in its errors.
std::string DescribePublish(const LeaseView& view, std::string_view name) {
  return "publish tensor " + std::to_string(view.tensor_id()) + " as '" + std::string(name) + "'";
}

}  // namespace

Session::Session(const ClientOptions& options, std::string socket_path,
                 std::unique_ptr<FdConnection> fd, std::shared_ptr<ReleaseQueue> queue)
    : socket_path_(std::move(socket_path)),
      fd_(std::move(fd)),
      queue_(std::move(queue)),
      mappings_(common::ProcessImporters(), options.lease_cache_linger),
      leases_(options.lease_cache, options.lease_cache_linger),
      channel_(socket_path_, *fd_, options.trusted_daemon_uids,
               RpcChannel::Handlers{
                   [this](const tensord::v1::SessionResponse& push) { OnPush(push); },
                   [this](const tensord::v1::SessionResponse& reply) { OnOrphan(reply); },
                   [this](absl::Status failure) { quiet_.OnFailure(std::move(failure)); }}),
      adopter_(*fd_, mappings_, leases_, queue_),
      allocator_(options.allocate_ahead, channel_, adopter_, queue_, [this] { return Flush(); }),
      releases_(leases_, mappings_, channel_,
                [this](Clock::time_point now) { return TickExports(now); }) {}

absl::StatusOr<std::shared_ptr<Session>> Session::Open(const ClientOptions& options,
                                                       const std::string& socket_path) {
  const std::string name = options.client_name.empty() ? DefaultClientName() : options.client_name;
  absl::Status directory =
      common::CheckSocketDirectory(socket_path, ::geteuid(), options.trusted_daemon_uids);
  if (!directory.ok()) {
    if (directory.code() != absl::StatusCode::kUnavailable) return directory;
    return absl::UnavailableError(NoBrokerMessage(socket_path, std::string(directory.message())));
  }
  absl::StatusOr<std::unique_ptr<FdConnection>> fd =
      FdConnection::Connect(common::FdChannelPath(socket_path), name, options.trusted_daemon_uids);
  if (!fd.ok()) {
    switch (fd.status().code()) {
      case absl::StatusCode::kPermissionDenied:     // socket mode, or an untrusted daemon uid
      case absl::StatusCode::kResourceExhausted:    // the broker is at --max-sessions
      case absl::StatusCode::kFailedPrecondition:   // protocol versions differ
        return fd.status();
      default:
        return absl::UnavailableError(NoBrokerMessage(socket_path, std::string(fd.status().message())));
    }
  }
  TENSORD_ASSIGN_OR_RETURN(std::shared_ptr<ReleaseQueue> queue, ReleaseQueue::Create());
  std::shared_ptr<Session> s(new Session(options, socket_path, *std::move(fd), std::move(queue)));
  // Its errors (a refused peer above all) say what they are; the stream's below do not.
  TENSORD_RETURN_IF_ERROR(s->channel_.Connect());
  absl::StatusOr<std::shared_ptr<SessionStream>> stream = s->channel_.Stream();
  if (!stream.ok()) return absl::UnavailableError(NoBrokerMessage(socket_path, std::string(stream.status().message())));
  ReleaseSender::Options sender_options;
  sender_options.hangup_fd = s->fd_->socket();
  Session* raw = s.get();
  sender_options.on_hangup = [raw] {
    raw->channel_.MarkDead();
    spdlog::warn("tensord: the broker at {} closed the session", raw->socket_path_);
  };
  s->sender_ = std::make_unique<ReleaseSender>(s->queue_, &s->releases_, std::move(sender_options));
  return s;
}

Session::~Session() {
  channel_.MarkClosing();
  // Its call holds the stream, which must go before the channel.
  allocator_.GiveUpAhead();
  if (sender_ != nullptr) sender_->Stop();
  // Closing the session releases every lease: not before this process's device work on
  // them has finished.
  releases_.DestroyAwaitingDone();
  channel_.DropStream();
  // Cached leases go with the session (closing the fd channel releases them).
  for (LeaseView* view : leases_.TakeAllIdle()) delete view;
}

void Session::ShutdownAtExit() {
  channel_.MarkClosing();
  if (sender_ != nullptr) sender_->Stop();
  channel_.CloseStream();
}

void Session::AbandonInForkedChild() noexcept {
  // Only the forking thread exists here; a lock another thread held stays held, so nothing
  // below takes one.
  channel_.AbandonInForkedChild();
  fd_->CloseInForkedChild();
  if (sender_ != nullptr) {
    sender_->AbandonInForkedChild();
    (void)sender_.release();
  }
}

void Session::OnPush(const tensord::v1::SessionResponse& push) {
  std::vector<LeaseView*> dropped;
  if (push.has_retired()) {
    dropped = leases_.OnRetired(push.retired().tensor_id());
  } else if (push.has_export_released()) {
    // The source is dropped on the sender thread: it may be user code, and this thread may
    // be a caller's, inside another call.
    if (exports_.Release(push.export_released().tensor_id(), push.export_released().buffer_id())) {
      queue_->Wake();
    }
  } else if (push.has_recycled_buffer_freed()) {
    // The producer's writable mapping, or a reader's kept one: the broker will not hand the
    // buffer out again, and the memory is free once no process maps it.
    allocator_.OnRecycledBufferFreed(push.recycled_buffer_freed().buffer_id());
    mappings_.DropKept(push.recycled_buffer_freed().buffer_id());
  } else if (push.has_cache_reset()) {
    // A RecycledBufferFreed may have been lost: keep nothing the broker may have freed
    // (what it still pools is never offered again, so it never hands it out).
    allocator_.ForgetRecycled();
    dropped = leases_.DropAllCached();
    exports_.MarkUnsure();
    queue_->Wake();
  }
  // Idle views are at refcount zero and no longer cacheable: the sender releases them.
  for (LeaseView* view : dropped) ReleaseQueue::Push(view);
}

void Session::OnOrphan(const tensord::v1::SessionResponse& reply) {
  // The caller gave up waiting; a lease the reply grants is nobody's: release it.
  uint64_t lease = 0;
  if (reply.has_acquire()) lease = reply.acquire().lease_id();
  if (reply.has_take()) lease = reply.take().lease_id();
  if (reply.has_allocate()) lease = reply.allocate().lease_id();
  if (lease != 0) queue_->PushLeaseIds({lease});
}

void Session::ForgetName(std::string_view name) {
  for (LeaseView* view : leases_.DropName(name)) ReleaseQueue::Push(view);
}

absl::StatusOr<LeaseView*> Session::Acquire(const Target& target, const AcquireOptions& options) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const ViewKind kind = ConsumerViewKind(options);
  const std::string* name = std::get_if<std::string>(&target);
  const std::string what = name != nullptr
                               ? "acquire '" + *name + "'"
                               : "acquire tensor " + std::to_string(std::get<uint64_t>(target));
  if (name != nullptr) {
    if (LeaseView* hit = leases_.FindByName(*name, kind, options.min_generation)) {
      return LeaseAdopter::Ordered(hit, options.stream);
    }
  }
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionResponse response,
                           channel_.StreamCall(AcquireRequest(target, options), RpcChannel::ReplyBound(options.wait),
                                              CancelState::Of(options.cancel)));
  if (!response.has_acquire()) {
    return absl::InternalError(what + ": the broker answered with something else");
  }
  return LeaseAdopter::Ordered(
      adopter_.AdoptLease(response.acquire().lease_id(), response.acquire().tensor(),
                          GrantedFence::Of(response.acquire()), kind,
                          name != nullptr ? std::string_view(*name) : std::string_view(), what),
      options.stream);
}

absl::Status Session::PrepareTake(ViewKind kind, const std::string& what, tensord::v1::TakeRequest& take) const {
  const tensord::v1::DeviceType view = ViewTypeOf(kind);
  if (view == tensord::v1::DEVICE_TYPE_UNSPECIFIED) return absl::OkStatus();
  absl::StatusOr<common::Importer*> importer = common::ProcessImporters().For(view);
  if (!importer.ok()) return Annotate(importer.status(), what);
  TENSORD_RETURN_IF_ERROR((*importer)->CheckUsable(what));
  take.set_memory_type((*importer)->viewed_memory_type());
  return absl::OkStatus();
}

absl::StatusOr<LeaseView*> Session::Take(std::string_view name_or_prefix, const TakeOptions& options) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const Wait& wait = options.wait;
  const std::string what = "take '" + std::string(name_or_prefix) + "'";
  tensord::v1::SessionRequest request;
  tensord::v1::TakeRequest* take = request.mutable_take();
  take->set_name_or_prefix(std::string(name_or_prefix));
  TENSORD_RETURN_IF_ERROR(PrepareTake(ConsumerViewKind(options), what, *take));
  if (wait.forever()) {
    take->set_forever(true);
  } else if (wait.millis() > 0) {
    take->set_timeout_ms(static_cast<uint64_t>(wait.millis()));
  }
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionResponse response,
                           channel_.StreamCall(std::move(request), RpcChannel::ReplyBound(wait),
                                              CancelState::Of(options.cancel)));
  if (!response.has_take()) {
    return absl::InternalError(what + ": the broker answered with something else");
  }
  // The name is unbound now: a cached lease of it must not serve it any more.
  ForgetName(response.take().tensor().name());
  return LeaseAdopter::Ordered(adopter_.AdoptLease(response.take().lease_id(), response.take().tensor(),
                                                   GrantedFence::Of(response.take()), ConsumerViewKind(options), "",
                                                   what),
                               kLegacyDefaultStream);
}

tensord::v1::SessionRequest Session::AcquireRequest(const Target& target,
                                                   const AcquireOptions& options) {
  tensord::v1::SessionRequest request;
  tensord::v1::AcquireRequest* acquire = request.mutable_acquire();
  if (const std::string* name = std::get_if<std::string>(&target)) {
    acquire->set_name(*name);
  } else {
    acquire->set_tensor_id(std::get<uint64_t>(target));
  }
  if (options.wait.forever()) {
    acquire->set_forever(true);
  } else if (options.wait.millis() > 0) {
    acquire->set_timeout_ms(static_cast<uint64_t>(options.wait.millis()));
  }
  acquire->set_min_generation(options.min_generation);
  return request;
}

absl::StatusOr<LeaseView*> Session::Allocate(std::string_view ns, const TensorSpec& spec) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  return allocator_.Allocate(ns, spec);
}

absl::StatusOr<LeaseView*> Session::AllocateInQueue(std::string_view prefix, const TensorSpec& spec,
                                                    const QueueSlotOptions& options) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  return allocator_.AllocateInQueue(prefix, spec, options);
}

absl::StatusOr<tensord::v1::SessionRequest> Session::PublishRequest(
    const LeaseView& view, std::string_view name, const PublishOptions& options,
    std::string_view what) const {
  if (view.session_id() != session_id()) {
    return absl::FailedPreconditionError(std::string(what) +
                                         ": it was allocated in another session");
  }
  if (view.kind() != ViewKind::kProducer) {
    return absl::FailedPreconditionError(
        std::string(what) + ": only a tensor this client allocated or exported can be published");
  }
  tensord::v1::SessionRequest request;
  tensord::v1::PublishRequest* publish = request.mutable_publish();
  publish->set_tensor_id(view.tensor_id());
  publish->set_name(std::string(name));
  switch (options.condition) {
    case PublishOptions::Condition::kAlways: break;
    case PublishOptions::Condition::kIfAbsent: publish->set_if_absent(true); break;
    case PublishOptions::Condition::kIfGeneration:
      publish->set_if_generation(options.generation);
      break;
  }
  publish->set_ttl_ms(options.ttl.count() > 0 ? static_cast<uint64_t>(options.ttl.count()) : 0);
  publish->set_unbind_on_exit(options.unbind_on_exit);
  publish->mutable_tags()->insert(options.tags.begin(), options.tags.end());
  // Device memory: consumers' streams wait on this, after the work queued on ours so far
  // (none when the producer says its writes are done).
  if (options.stream != kNoStream) {
    absl::StatusOr<std::string> ready_fence = view.RecordReady(options.stream);
    if (!ready_fence.ok()) return Annotate(ready_fence.status(), what);
    publish->set_ready_fence(*std::move(ready_fence));
  }
  if (view.described_here()) {
    // A pooled slot: the broker still has it as uint8[slot]; this is what it holds.
    TensorSpec spec;
    spec.dtype = view.info().dtype;
    spec.shape = view.info().shape;
    spec.strides = view.info().strides;
    spec.device = view.info().device;
    absl::StatusOr<tensord::v1::TensorDesc> desc = SpecToDesc(spec);
    if (!desc.ok()) return Annotate(desc.status(), what);
    *publish->mutable_desc() = *std::move(desc);
  }
  return request;
}

absl::StatusOr<TensorInfo> Session::Publish(const LeaseView& view, std::string_view name,
                                            const PublishOptions& options) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const std::string what = DescribePublish(view, name);
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionRequest request,
                           PublishRequest(view, name, options, what));
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionResponse response,
                           channel_.StreamCall(std::move(request), kDefaultCallTimeout));
  if (!response.has_publish()) {
    return absl::InternalError(what + ": the broker answered with something else");
  }
  TENSORD_ASSIGN_OR_RETURN(ValidatedTensor valid,
                           ValidateTensorInfo(response.publish().tensor(), what));
  return std::move(valid.info);
}

absl::Status Session::PublishNoWait(const LeaseView& view, std::string_view name,
                                    const PublishOptions& options) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  std::string what = DescribePublish(view, name);
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionRequest request,
                           PublishRequest(view, name, options, what));
  absl::StatusOr<std::shared_ptr<SessionStream>> stream = channel_.Stream();
  if (stream.ok() && QuietPublishes::HasRoom(**stream)) {
    request.mutable_publish()->set_quiet(true);
    if ((*stream)->SendQuiet(std::move(request), std::move(what)).ok()) return absl::OkStatus();
    // Not written (the stream broke): the waited publish below opens a new one.
  }
  return Publish(view, name, options).status();
}

absl::Status Session::Flush() {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  if (!sender_->Flush(kDefaultCallTimeout)) {
    return absl::DeadlineExceededError("flush: the release sender did not finish in time");
  }
  // The stream is ordered: once the broker answers this, it has every release sent before,
  // and the failure of every publish sent without waiting before it has arrived.
  tensord::v1::SessionRequest request;
  request.mutable_release();
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionResponse response,
                           channel_.StreamCall(std::move(request), kDefaultCallTimeout));
  if (!response.has_release()) {
    return absl::InternalError("flush: the broker answered with something else");
  }
  return quiet_.Report();
}

}  // namespace tensord::internal
