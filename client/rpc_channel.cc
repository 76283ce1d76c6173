#include "client/rpc_channel.h"

#include <algorithm>
#include <utility>

#include "client/cancel_state.h"
#include "client/status_util.h"
#include "common/logging.h"
#include "common/protocol_limits.h"
#include "common/status.h"

namespace tensord::internal {

std::string NoBrokerMessage(const std::string& socket_path, std::string_view cause) {
  return "no tensord broker at " + socket_path + ": " + std::string(cause) +
         " (is the daemon running?)";
}

std::optional<std::chrono::milliseconds> RpcChannel::ReplyBound(Wait wait) {
  if (wait.forever()) return std::nullopt;
  if (wait.millis() <= 0) return kDefaultCallTimeout;
  // The broker cuts a wait to kMaxDurationMs; so does the bound, which must not overflow.
  const auto millis = std::min<uint64_t>(static_cast<uint64_t>(wait.millis()), common::kMaxDurationMs);
  return std::chrono::milliseconds(millis) + kWaitSlack;
}

RpcChannel::RpcChannel(std::string socket_path, const FdConnection& fd,
                       std::vector<uint32_t> trusted_uids, Handlers handlers)
    : socket_path_(std::move(socket_path)),
      fd_(fd),
      trusted_uids_(std::move(trusted_uids)),
      handlers_(std::move(handlers)) {}

RpcChannel::~RpcChannel() { DropStream(); }

absl::Status RpcChannel::CheckOpen() const {
  if (closing_.load(std::memory_order_acquire)) {
    return absl::UnavailableError("the tensord client is shut down");
  }
  if (dead_.load(std::memory_order_acquire)) {
    return absl::UnavailableError("the broker at " + socket_path_ + " closed the session");
  }
  return absl::OkStatus();
}

void RpcChannel::CloseStream() {
  std::shared_ptr<SessionStream> stream;
  {
    absl::MutexLock lock(&mu_);
    stream = stream_;
  }
  if (stream != nullptr) stream->Close();
}

void RpcChannel::DropStream() {
  std::shared_ptr<SessionStream> stream;
  {
    absl::MutexLock lock(&mu_);
    stream = std::move(stream_);
  }
  if (stream != nullptr) stream->Close();
  stream.reset();
}

void RpcChannel::AbandonInForkedChild() noexcept ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Only the forking thread exists here; a lock another thread held stays held, so nothing
  // below takes one. After a complete SuspendForFork there is no gRPC object left to leak.
  forked_away_.store(true);
  dead_.store(true);
  closing_.store(true);
  if (stream_ != nullptr) {
    stream_->AbandonInForkedChild();
    new std::shared_ptr<SessionStream>(std::move(stream_));
  }
  if (connection_ != nullptr) new std::shared_ptr<GrpcConnection>(std::move(connection_));
}

std::unique_ptr<grpc::ClientContext> RpcChannel::NewContext(
    std::optional<std::chrono::milliseconds> timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata("tensord-session", fd_.welcome().session_token());
  if (timeout.has_value()) context->set_deadline(std::chrono::system_clock::now() + *timeout);
  return context;
}

absl::Status RpcChannel::Connect() {
  absl::MutexLock lock(&mu_);
  return ConnectionLocked().status();
}

absl::StatusOr<std::shared_ptr<GrpcConnection>> RpcChannel::ConnectionLocked() {
  // A channel made from an fd never reconnects by itself: once the broker closed the
  // connection (a per-uid connection limit, say), the next call makes a new one. Calls still
  // on the old one keep it until they end.
  if (connection_ != nullptr && !connection_->Closed()) return connection_;
  const auto session_over = [this] {
    dead_.store(true, std::memory_order_release);
    return absl::UnavailableError("the broker at " + socket_path_ + " closed the session");
  };
  // A new connection of a session whose daemon is gone would reach its successor, whose pid
  // differs: that is the end of the session, not an impostor.
  if (fd_.PeerClosed()) return session_over();
  absl::StatusOr<std::shared_ptr<GrpcConnection>> fresh =
      GrpcConnection::Connect(socket_path_, fd_.daemon(), trusted_uids_);
  if (!fresh.ok()) {
    if (fd_.PeerClosed()) return session_over();
    if (fresh.status().code() == absl::StatusCode::kPermissionDenied) return fresh.status();
    return absl::UnavailableError(NoBrokerMessage(socket_path_, std::string(fresh.status().message())));
  }
  connection_ = *std::move(fresh);
  return connection_;
}

std::shared_ptr<GrpcConnection> RpcChannel::connection_for_test() {
  absl::MutexLock lock(&mu_);
  return connection_;
}

void RpcChannel::AwaitNoForkLocked() {
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !fork_suspended_; };
  mu_.Await(absl::Condition(&ready));
}

absl::StatusOr<RpcChannel::Call> RpcChannel::BeginCall(std::optional<std::chrono::milliseconds> timeout,
                                                       bool cancel_on_fork) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  std::unique_ptr<grpc::ClientContext> context = NewContext(timeout);
  absl::MutexLock lock(&mu_);
  AwaitNoForkLocked();
  TENSORD_ASSIGN_OR_RETURN(std::shared_ptr<GrpcConnection> connection, ConnectionLocked());
  ++calls_in_flight_;
  if (cancel_on_fork) fork_cancellable_.insert(context.get());
  return Call(this, std::move(connection), std::move(context), fork_epoch_);
}

RpcChannel::Call::~Call() {
  if (channel_ == nullptr) return;
  {
    absl::MutexLock lock(&channel_->mu_);
    channel_->fork_cancellable_.erase(context_.get());
  }
  context_.reset();
  // Before the call stops counting: fork() preparation drops the last gRPC object it waits for.
  connection_.reset();
  channel_->EndCall();
}

bool RpcChannel::Call::interrupted_by_fork() const {
  return channel_ != nullptr && channel_->fork_epoch_seen() != epoch_;
}

void RpcChannel::EndCall() {
  absl::MutexLock lock(&mu_);
  --calls_in_flight_;
}

bool RpcChannel::SuspendForFork(std::chrono::steady_clock::time_point deadline) {
  std::shared_ptr<SessionStream> stream;
  {
    absl::MutexLock lock(&mu_);
    fork_suspended_ = true;
    fork_epoch_.fetch_add(1);
    stream = std::move(stream_);
    for (grpc::ClientContext* context : fork_cancellable_) context->TryCancel();
  }
  if (stream != nullptr) stream->Drain(deadline);
  stream.reset();
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_in_flight_ == 0; };
  mu_.AwaitWithDeadline(absl::Condition(&idle),
                        absl::FromChrono(std::chrono::system_clock::now() +
                                         (deadline - std::chrono::steady_clock::now())));
  if (calls_in_flight_ != 0) {
    spdlog::warn("tensord: {} call(s) still in flight at fork(); gRPC stays up in the parent",
                 calls_in_flight_);
    return false;
  }
  // The channel was made from a socket connected already: no connection attempt of gRPC's
  // can be under way to keep gRPC alive after it goes.
  connection_.reset();
  return true;
}

void RpcChannel::ResumeAfterFork() {
  absl::MutexLock lock(&mu_);
  fork_suspended_ = false;
}

absl::StatusOr<std::shared_ptr<SessionStream>> RpcChannel::Stream() {
  std::shared_ptr<SessionStream> old;  // closed outside the lock
  absl::MutexLock lock(&mu_);
  AwaitNoForkLocked();
  if (stream_ != nullptr && !stream_->broken()) return stream_;
  if (closing_.load()) return absl::UnavailableError("the tensord client is shut down");
  old = std::move(stream_);
  TENSORD_ASSIGN_OR_RETURN(std::shared_ptr<GrpcConnection> connection, ConnectionLocked());
  // The stream's context keeps the channel up for as long as the stream lives.
  TENSORD_ASSIGN_OR_RETURN(
      std::unique_ptr<SessionStream> fresh,
      SessionStream::Open(connection->stub(), fd_.welcome().session_token(), handlers_.on_push,
                          handlers_.on_orphan, handlers_.on_quiet_failure));
  // The stream counts as a call in flight until its last holder lets go of it.
  ++calls_in_flight_;
  stream_ = std::shared_ptr<SessionStream>(fresh.release(), [this](SessionStream* stream) {
    delete stream;
    EndCall();
  });
  return stream_;
}

void RpcChannel::KeepStreamOpen() {
  {
    absl::MutexLock lock(&mu_);
    if (stream_ != nullptr && !stream_->broken()) return;
  }
  (void)Stream();
}

absl::StatusOr<tensord::v1::SessionResponse> RpcChannel::StreamCall(
    tensord::v1::SessionRequest request, std::optional<std::chrono::milliseconds> wait, CancelState* cancel) {
  std::vector<tensord::v1::SessionRequest> one;
  one.push_back(std::move(request));
  return std::move(StreamCallMany(std::move(one), wait, cancel)[0]);
}

std::vector<absl::StatusOr<tensord::v1::SessionResponse>> RpcChannel::StreamCallMany(
    std::vector<tensord::v1::SessionRequest> requests,
    std::optional<std::chrono::milliseconds> wait, CancelState* cancel) {
  std::optional<SessionStream::Clock::time_point> deadline;
  if (wait.has_value()) deadline = SessionStream::Clock::now() + *wait;
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> results(
      requests.size(), absl::UnavailableError("the session stream is closed"));
  std::vector<size_t> todo(requests.size());
  for (size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  while (!todo.empty()) {
    absl::StatusOr<std::shared_ptr<SessionStream>> stream = Stream();
    if (!stream.ok()) {
      for (size_t i : todo) results[i] = stream.status();
      break;
    }
    std::vector<tensord::v1::SessionRequest> batch;
    batch.reserve(todo.size());
    for (size_t i : todo) batch.push_back(requests[i]);
    std::vector<absl::StatusOr<tensord::v1::SessionResponse>> replies =
        (*stream)->CallMany(std::move(batch), deadline, cancel);
    std::vector<size_t> retry;
    for (size_t k = 0; k < todo.size(); ++k) {
      const size_t i = todo[k];
      if ((*stream)->IsInterruptedByDrain(replies[k]) && !(cancel != nullptr && cancel->cancelled())) {
        // A fork() drained the stream under this call: ask again on the next stream, with
        // what is left of the wait.
        ShortenWait(requests[i], deadline);
        retry.push_back(i);
      } else {
        results[i] = ReplyStatus(std::move(replies[k]));
      }
    }
    todo = std::move(retry);
  }
  return results;
}

absl::StatusOr<std::unique_ptr<SessionStream::PendingCall>> RpcChannel::StreamStart(
    tensord::v1::SessionRequest request) {
  TENSORD_ASSIGN_OR_RETURN(std::shared_ptr<SessionStream> stream, Stream());
  return SessionStream::Start(std::move(stream), std::move(request));
}

absl::StatusOr<tensord::v1::SessionResponse> RpcChannel::Await(SessionStream::PendingCall& call,
                                                               std::chrono::milliseconds wait) {
  absl::StatusOr<tensord::v1::SessionResponse> reply = call.Await(SessionStream::Clock::now() + wait);
  if (call.stream().IsInterruptedByDrain(reply)) {
    return absl::UnavailableError("a fork() drained the session stream before the broker answered");
  }
  return ReplyStatus(std::move(reply));
}

absl::StatusOr<tensord::v1::SessionResponse> RpcChannel::ReplyStatus(
    absl::StatusOr<tensord::v1::SessionResponse> reply) {
  if (!reply.ok()) return reply.status();
  if (reply->has_error()) return ToAbsl(FromRpcError(reply->error()));
  return reply;
}

void RpcChannel::ShortenWait(tensord::v1::SessionRequest& request,
                             std::optional<SessionStream::Clock::time_point> deadline) {
  if (!deadline.has_value()) return;
  // The reply bound carries kWaitSlack on top of the broker's own wait.
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      *deadline - kWaitSlack - SessionStream::Clock::now());
  const uint64_t ms = static_cast<uint64_t>(std::max<int64_t>(1, left.count()));
  if (request.has_acquire() && request.acquire().timeout_ms() > 0) {
    request.mutable_acquire()->set_timeout_ms(ms);
  } else if (request.has_take() && request.take().timeout_ms() > 0) {
    request.mutable_take()->set_timeout_ms(ms);
  }
}

}  // namespace tensord::internal
