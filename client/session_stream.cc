#include "client/session_stream.h"

#include <utility>

#include "client/status_util.h"

namespace tensord::internal {

absl::StatusOr<std::unique_ptr<SessionStream>> SessionStream::Open(tensord::v1::Broker::Stub* stub,
                                                                   const std::string& session_token,
                                                                   Handler on_push,
                                                                   Handler on_orphan) {
  std::unique_ptr<SessionStream> s(new SessionStream(std::move(on_push), std::move(on_orphan)));
  s->context_ = std::make_unique<grpc::ClientContext>();
  s->context_->AddMetadata("tensord-session", session_token);
  s->stream_ = stub->Session(s->context_.get());
  if (s->stream_ == nullptr) return absl::UnavailableError("could not open the session stream");
  SessionStream* raw = s.get();
  s->reader_ = std::thread([raw] { raw->ReadLoop(); });
  return s;
}

SessionStream::~SessionStream() { Close(); }

void SessionStream::Close() {
  if (closed_.exchange(true)) return;
  if (context_ != nullptr) context_->TryCancel();
  if (reader_.joinable()) reader_.join();
}

void SessionStream::Drain(Clock::time_point deadline) {
  if (closed_.load()) return;
  draining_.store(true);
  {
    absl::MutexLock lock(&write_mu_);
    if (!broken_.load(std::memory_order_acquire)) stream_->WritesDone();
  }
  {
    absl::MutexLock lock(&mu_);
    auto ended = [this]() { return broken_.load(std::memory_order_acquire); };
    mu_.AwaitWithDeadline(absl::Condition(&ended),
                          absl::FromChrono(std::chrono::system_clock::now() +
                                           (deadline - Clock::now())));
  }
  Close();
}

bool SessionStream::IsInterruptedByDrain(
    const absl::StatusOr<tensord::v1::SessionResponse>& result) const {
  if (!draining_.load()) return false;
  if (!result.ok()) return result.status().code() == absl::StatusCode::kUnavailable;
  return result->has_error() && result->error().code() == static_cast<int>(grpc::StatusCode::CANCELLED);
}

void SessionStream::AbandonInForkedChild() noexcept {
  closed_.store(true);
  broken_.store(true);
  new std::thread(std::move(reader_));  // leaked on purpose: no such thread in the child
  (void)context_.release();
  (void)stream_.release();
}

void SessionStream::ReadLoop() {
  tensord::v1::SessionResponse response;
  while (stream_->Read(&response)) {
    if (response.seq() == 0) {
      if (on_push_) on_push_(response);
      continue;
    }
    Waiter* waiter = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(response.seq());
      if (it != pending_.end()) {
        waiter = it->second;
        pending_.erase(it);
        waiter->result = std::move(response);
        waiter->done = true;
        response = tensord::v1::SessionResponse();
      }
    }
    if (waiter == nullptr && on_orphan_) on_orphan_(response);
  }
  broken_.store(true, std::memory_order_release);
  grpc::Status status;
  {
    // Finish must not overlap a Write; writers see broken_ and stop.
    absl::MutexLock lock(&write_mu_);
    status = stream_->Finish();
  }
  std::string message = "the session stream ended: " +
                        (status.ok() ? std::string("the broker closed it")
                                     : FromGrpc(status).ToString());
  absl::MutexLock lock(&mu_);
  end_message_ = message;
  for (auto& [seq, waiter] : pending_) {
    waiter->result = absl::UnavailableError(message);
    waiter->done = true;
  }
  pending_.clear();
}

absl::Status SessionStream::Write(const tensord::v1::SessionRequest& request) {
  absl::MutexLock lock(&write_mu_);
  if (broken_.load(std::memory_order_acquire) || closed_.load() || draining_.load()) {
    return absl::UnavailableError("the session stream is closed");
  }
  if (!stream_->Write(request)) {
    broken_.store(true, std::memory_order_release);
    return absl::UnavailableError("the session stream broke while writing");
  }
  return absl::OkStatus();
}

absl::Status SessionStream::Send(tensord::v1::SessionRequest request) {
  request.set_seq(0);
  return Write(request);
}

absl::StatusOr<tensord::v1::SessionResponse> SessionStream::Call(
    tensord::v1::SessionRequest request, std::optional<Clock::time_point> deadline) {
  Waiter waiter;
  {
    absl::MutexLock lock(&mu_);
    if (broken_.load(std::memory_order_acquire)) {
      return absl::UnavailableError(end_message_.empty() ? "the session stream is closed"
                                                         : end_message_);
    }
    request.set_seq(next_seq_++);
    pending_[request.seq()] = &waiter;
  }
  absl::Status written = Write(request);
  absl::MutexLock lock(&mu_);
  if (!written.ok()) {
    if (!waiter.done) pending_.erase(request.seq());
    return written;
  }
  auto done = [&waiter]() { return waiter.done; };
  if (deadline.has_value()) {
    mu_.AwaitWithDeadline(absl::Condition(&done), absl::FromChrono(
        std::chrono::system_clock::now() + (*deadline - Clock::now())));
  } else {
    mu_.Await(absl::Condition(&done));
  }
  if (!waiter.done) {
    // Too late now; a reply that still comes goes to the orphan handler.
    pending_.erase(request.seq());
    return absl::DeadlineExceededError("the broker did not answer on the session stream in time");
  }
  return std::move(waiter.result);
}

}  // namespace tensord::internal
