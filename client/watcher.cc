#include "client/watcher.h"

#include <utility>

#include "client/status_util.h"
#include "client/tensor_convert.h"

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
  std::unique_ptr<WatcherImpl> w(new WatcherImpl(std::move(session)));
  w->context_ = w->session_->NewContext(std::nullopt);
  tensord::v1::WatchRequest request;
  request.set_prefix(std::string(prefix));
  request.set_initial(initial);
  w->reader_ = w->session_->stub()->Watch(w->context_.get(), request);
  if (w->reader_ == nullptr) return absl::UnavailableError("watch: could not open the stream");
  WatcherImpl* raw = w.get();
  w->thread_ = std::thread([raw] { raw->ReadLoop(); });
  return std::unique_ptr<Watcher>(std::move(w));
}

WatcherImpl::~WatcherImpl() {
  Cancel();
  if (thread_.joinable()) thread_.join();
}

void WatcherImpl::ReadLoop() {
  tensord::v1::WatchEvent event;
  while (reader_->Read(&event)) {
    absl::StatusOr<WatchEvent> converted = ToPublicEvent(event);
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return cancelled_ || queue_.size() < kMaxQueued;
    };
    mu_.Await(absl::Condition(&room));
    if (cancelled_) break;
    queue_.push_back(std::move(converted));
  }
  grpc::Status status = reader_->Finish();
  absl::MutexLock lock(&mu_);
  ended_ = true;
  end_status_ = status.ok() ? Status(StatusCode::kUnavailable, "watch: the broker ended the stream")
                            : Annotate(FromGrpc(status), "watch");
}

Result<std::optional<WatchEvent>> WatcherImpl::Next(std::chrono::milliseconds timeout) {
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
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
  }
  context_->TryCancel();
}

}  // namespace tensord::internal
