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
  TENSORD_ASSIGN_OR_RETURN(Session::RpcCall call,
                           w->session_->BeginCall(std::nullopt, /*cancel_on_fork=*/true));
  std::unique_ptr<Reader> reader = w->Open(call, initial);
  WatcherImpl* raw = w.get();
  w->thread_ = std::thread([raw, call = std::move(call), reader = std::move(reader)]() mutable {
    raw->Run(std::move(call), std::move(reader));
  });
  return std::unique_ptr<Watcher>(std::move(w));
}

WatcherImpl::~WatcherImpl() {
  if (session_->forked_away()) {
    // A fork child: the reader thread and its call are the parent's; leak them untouched.
    if (thread_.joinable()) new std::thread(std::move(thread_));
    return;
  }
  Cancel();
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<WatcherImpl::Reader> WatcherImpl::Open(const Session::RpcCall& call, bool initial) {
  tensord::v1::WatchRequest request;
  request.set_prefix(prefix_);
  request.set_initial(initial);
  std::unique_ptr<Reader> reader = call.stub()->Watch(call.context(), request);
  reader->WaitForInitialMetadata();
  return reader;
}

void WatcherImpl::Run(Session::RpcCall first_call, std::unique_ptr<Reader> first_reader) {
  std::optional<Session::RpcCall> call(std::move(first_call));
  std::unique_ptr<Reader> reader = std::move(first_reader);
  bool reopened = false;
  for (;;) {
    grpc::Status status = ReadCall(*call, std::move(reader), reopened);
    const bool forked = call->interrupted_by_fork();
    call.reset();  // gone before the fork may go on
    {
      absl::MutexLock lock(&mu_);
      if (!forked || cancelled_) {
        ended_ = true;
        if (cancelled_) return;
        end_status_ = status.ok()
                          ? Status(StatusCode::kUnavailable, "watch: the broker ended the stream")
                          : Annotate(FromGrpc(status), "watch");
        return;
      }
    }
    // Waits until the fork is over.
    absl::StatusOr<Session::RpcCall> next = session_->BeginCall(std::nullopt, true);
    if (!next.ok()) {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      end_status_ = Annotate(FromAbsl(next.status()), "watch");
      return;
    }
    call.emplace(*std::move(next));
    reader = Open(*call, /*initial=*/false);
    reopened = true;
  }
}

grpc::Status WatcherImpl::ReadCall(const Session::RpcCall& call, std::unique_ptr<Reader> reader,
                                   bool reopened) {
  {
    absl::MutexLock lock(&mu_);
    context_ = call.context();
    if (cancelled_) context_->TryCancel();
    if (reopened) {
      // Changes made while the stream was down were not seen: the caller must list again.
      WatchEvent reset;
      reset.kind = WatchEvent::Kind::kReset;
      queue_.push_back(std::move(reset));
    }
  }
  tensord::v1::WatchEvent event;
  while (reader->Read(&event)) {
    absl::StatusOr<WatchEvent> converted = ToPublicEvent(event);
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return cancelled_ || queue_.size() < kMaxQueued;
    };
    // A full queue parks the reader; a fork must still get the call back, so look again
    // every 100 ms.
    while (!mu_.AwaitWithTimeout(absl::Condition(&room), absl::Milliseconds(100))) {
      if (call.interrupted_by_fork()) break;
    }
    if (cancelled_ || call.interrupted_by_fork()) {
      context_->TryCancel();
      break;
    }
    queue_.push_back(std::move(converted));
  }
  grpc::Status status = reader->Finish();
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
  return status;
}

Result<std::optional<WatchEvent>> WatcherImpl::Next(std::chrono::milliseconds timeout) {
  if (session_->forked_away()) {
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
  if (session_->forked_away()) return;
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

}  // namespace tensord::internal
