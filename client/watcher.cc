#include "client/watcher.h"

#include <utility>

#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "common/status.h"

namespace tensord::internal {

absl::StatusOr<WatchEvent> ToPublicEvent(const tensord::v1::WatchEvent& event) {
  WatchEvent out;
  switch (event.kind()) {
    case tensord::v1::WatchEvent::KIND_BOUND: out.kind = WatchEvent::Kind::kBound; break;
    case tensord::v1::WatchEvent::KIND_UNBOUND: out.kind = WatchEvent::Kind::kUnbound; break;
    case tensord::v1::WatchEvent::KIND_RESET: out.kind = WatchEvent::Kind::kReset; break;
    default:
      return absl::DataLossError("watch: the broker sent an event of unknown kind " +
                                 std::to_string(static_cast<int>(event.kind())));
  }
  out.name = event.name();
  out.generation = event.generation();
  if (out.kind == WatchEvent::Kind::kBound && event.has_tensor()) {
    absl::StatusOr<ValidatedTensor> valid =
        ValidateTensorInfo(event.tensor(), "watch event for '" + event.name() + "'");
    if (!valid.ok()) return valid.status();
    out.tensor = std::move(valid->info);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Watcher>> WatcherImpl::Start(std::shared_ptr<Session> session,
                                                            std::string_view prefix,
                                                            bool initial) {
  std::unique_ptr<WatcherImpl> w(new WatcherImpl(std::move(session), std::string(prefix)));
  TENSORD_RETURN_IF_ERROR(w->OpenStream(initial));
  w->session_->RegisterWatcher(w.get());
  return std::unique_ptr<Watcher>(std::move(w));
}

absl::Status WatcherImpl::OpenStream(bool initial) {
  std::unique_ptr<grpc::ClientContext> context = session_->NewContext(std::nullopt);
  tensord::v1::WatchRequest request;
  request.set_prefix(prefix_);
  request.set_initial(initial);
  auto reader = session_->stub()->Watch(context.get(), request);
  if (reader == nullptr) return absl::UnavailableError("watch: could not open the stream");
  {
    absl::MutexLock lock(&mu_);
    context_ = std::move(context);
    reader_ = std::move(reader);
  }
  thread_ = std::thread([this] { ReadLoop(); });
  return absl::OkStatus();
}

WatcherImpl::~WatcherImpl() {
  // First, so the fork hooks never see a watcher being torn down.
  session_->UnregisterWatcher(this);
  if (abandoned_.load()) return;  // fork child: nothing here may be touched
  Cancel();
  if (thread_.joinable()) thread_.join();
}

void WatcherImpl::PauseForFork() {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || ended_) return;
    pausing_ = true;
    context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
  // Kept until after the fork: destroying the call now would hand gRPC's executor work
  // that deadlocks grpc_prefork() (see Session::QuiesceForFork).
  absl::MutexLock lock(&mu_);
  parked_reader_ = std::move(reader_);
  parked_context_ = std::move(context_);
}

void WatcherImpl::ResumeAfterFork() {
  {
    absl::MutexLock lock(&mu_);
    parked_reader_.reset();
    parked_context_.reset();
    if (!pausing_) return;
    pausing_ = false;
    if (cancelled_) return;
    // Changes made while the stream was down were not seen: the caller must list again.
    WatchEvent reset;
    reset.kind = WatchEvent::Kind::kReset;
    queue_.push_back(std::move(reset));
  }
  absl::Status opened = OpenStream(/*initial=*/false);
  if (!opened.ok()) {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    end_status_ = FromAbsl(opened);
  }
}

void WatcherImpl::AbandonInForkedChild() noexcept {
  abandoned_.store(true);
  // The call (if any) is the parent's; never destroy gRPC objects here.
  (void)context_.release();
  (void)reader_.release();
  (void)parked_context_.release();
  (void)parked_reader_.release();
  if (thread_.joinable()) new std::thread(std::move(thread_));
}

void WatcherImpl::ReadLoop() {
  tensord::v1::WatchEvent event;
  while (reader_->Read(&event)) {
    absl::StatusOr<WatchEvent> converted = ToPublicEvent(event);
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return cancelled_ || pausing_ || queue_.size() < kMaxQueued;
    };
    mu_.Await(absl::Condition(&room));
    if (cancelled_ || pausing_) break;
    queue_.push_back(std::move(converted));
  }
  grpc::Status status = reader_->Finish();
  absl::MutexLock lock(&mu_);
  if (pausing_) return;  // a fork: ResumeAfterFork reopens the stream
  ended_ = true;
  end_status_ = status.ok() ? Status(StatusCode::kUnavailable, "watch: the broker ended the stream")
                            : Annotate(FromGrpc(status), "watch");
}

Result<std::optional<WatchEvent>> WatcherImpl::Next(std::chrono::milliseconds timeout) {
  if (abandoned_.load()) {
    return Status(StatusCode::kUnavailable,
                  "watch: this watcher belongs to the parent process (fork); watch again");
  }
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_ || ended_ || !queue_.empty();
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(timeout));
  if (cancelled_) return Status(StatusCode::kCancelled, "watch: cancelled");
  if (!queue_.empty()) {
    absl::StatusOr<WatchEvent> event = std::move(queue_.front());
    queue_.pop_front();
    if (!event.ok()) return FromAbsl(event.status());
    return std::optional<WatchEvent>(*std::move(event));
  }
  // UNAVAILABLE when the stream simply ended; the broker's own error (an ACL refusal, ...)
  // when it ended with one.
  if (ended_) return end_status_;
  return std::optional<WatchEvent>();
}

void WatcherImpl::Cancel() {
  if (abandoned_.load()) return;
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

}  // namespace tensord::internal
