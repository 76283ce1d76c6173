#include "client/session_stream.h"

#include <span>
#include <utility>

#include "client/status_util.h"

namespace tensord::internal {
namespace {

// What one SessionRequest.batch carries at most (the broker refuses more than 4096).
constexpr int kMaxBatchRequests = 4096;
constexpr size_t kMaxBatchRequestBytes = size_t{1} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<SessionStream>> SessionStream::Open(tensord::v1::Broker::Stub* stub,
                                                                   const std::string& session_token,
                                                                   Handler on_push,
                                                                   Handler on_orphan,
                                                                   QuietFailureHandler on_quiet_failure) {
  std::unique_ptr<SessionStream> s(new SessionStream(std::move(on_push), std::move(on_orphan),
                                                     std::move(on_quiet_failure)));
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

void SessionStream::Complete(Waiter* waiter,
                             absl::StatusOr<tensord::v1::SessionResponse> result) {
  waiter->result = std::move(result);
  waiter->done = true;
  --*waiter->outstanding;
}

void SessionStream::Deliver(std::span<tensord::v1::SessionResponse* const> replies) {
  if (replies.empty()) return;
  std::vector<tensord::v1::SessionResponse*> orphans;
  std::vector<absl::Status> quiet_failures;
  {
    absl::MutexLock lock(&mu_);
    for (tensord::v1::SessionResponse* reply : replies) {
      // Quiet requests written before this reply's request went through (a failure of
      // theirs would have come first); one with this very seq failed.
      while (!quiet_.empty() && quiet_.front().seq < reply->seq()) quiet_.pop_front();
      if (!quiet_.empty() && quiet_.front().seq == reply->seq()) {
        quiet_failures.push_back(Annotate(
            reply->has_error() ? ToAbsl(FromRpcError(reply->error()))
                               : absl::InternalError("the broker answered with something else"),
            quiet_.front().label));
        quiet_.pop_front();
        continue;
      }
      auto it = pending_.find(reply->seq());
      if (it == pending_.end()) {
        orphans.push_back(reply);
        continue;
      }
      Waiter* waiter = it->second;
      pending_.erase(it);
      Complete(waiter, std::move(*reply));
    }
  }
  if (on_orphan_) {
    for (tensord::v1::SessionResponse* orphan : orphans) on_orphan_(*orphan);
  }
  if (on_quiet_failure_) {
    for (absl::Status& failure : quiet_failures) on_quiet_failure_(std::move(failure));
  }
}

void SessionStream::ReadLoop() {
  tensord::v1::SessionResponse response;
  while (stream_->Read(&response)) {
    if (response.has_batch()) {
      // Messages queued together, handled in their order: each run of replies is delivered
      // under one lock, each push in between goes to the push handler.
      std::vector<tensord::v1::SessionResponse*> replies;
      for (auto& message : *response.mutable_batch()->mutable_responses()) {
        if (message.seq() != 0) {
          replies.push_back(&message);
          continue;
        }
        Deliver(replies);
        replies.clear();
        if (on_push_) on_push_(message);
      }
      Deliver(replies);
    } else if (response.seq() == 0) {
      if (on_push_) on_push_(response);
    } else {
      tensord::v1::SessionResponse* const one = &response;
      Deliver(std::span<tensord::v1::SessionResponse* const>(&one, 1));
    }
    response.Clear();
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
  std::deque<QuietRequest> unconfirmed;
  {
    absl::MutexLock lock(&mu_);
    end_message_ = message;
    for (auto& [seq, waiter] : pending_) Complete(waiter, absl::UnavailableError(message));
    pending_.clear();
    // A drain that ended cleanly means the broker read and handled everything written.
    if (!(draining_.load() && status.ok())) unconfirmed = std::move(quiet_);
    quiet_.clear();
  }
  if (on_quiet_failure_) {
    for (const QuietRequest& request : unconfirmed) {
      on_quiet_failure_(absl::UnavailableError(
          request.label + ": sent without waiting, and " + message +
          " before the broker confirmed it; it may not have happened"));
    }
  }
}

absl::Status SessionStream::ClosedStatus() const {
  return absl::UnavailableError(end_message_.empty() ? "the session stream is closed"
                                                     : end_message_);
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

size_t SessionStream::WriteAll(std::vector<tensord::v1::SessionRequest>& requests,
                               std::vector<Waiter>& waiters, std::vector<uint64_t>& seqs,
                               size_t* outstanding, absl::Status* error) {
  absl::MutexLock write_lock(&write_mu_);
  {
    // Seqs are handed out under the write lock, so their order is the order on the wire.
    absl::MutexLock lock(&mu_);
    if (broken_.load(std::memory_order_acquire)) {
      *error = ClosedStatus();
      return 0;
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      seqs[i] = next_seq_++;
      requests[i].set_seq(seqs[i]);
      waiters[i].outstanding = outstanding;
      pending_[seqs[i]] = &waiters[i];
    }
  }
  // One message for the lot (in chunks the broker accepts), so a batch costs the broker
  // and the transport one read instead of one per request. The requests are moved into
  // the envelopes.
  std::vector<tensord::v1::SessionRequest> envelopes;
  std::vector<size_t> ends;  // requests[0, ends[k]) are in envelopes[0..k]
  if (requests.size() == 1) {
    envelopes.push_back(std::move(requests[0]));
    ends.push_back(1);
  } else {
    size_t bytes = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const size_t size = requests[i].ByteSizeLong();
      if (envelopes.empty() || envelopes.back().batch().requests_size() >= kMaxBatchRequests ||
          bytes + size > kMaxBatchRequestBytes) {
        if (!envelopes.empty()) ends.push_back(i);
        envelopes.emplace_back().mutable_batch();
        bytes = 0;
      }
      bytes += size;
      *envelopes.back().mutable_batch()->add_requests() = std::move(requests[i]);
    }
    ends.push_back(requests.size());
  }
  for (size_t k = 0; k < envelopes.size(); ++k) {
    const size_t written = k == 0 ? 0 : ends[k - 1];
    if (broken_.load(std::memory_order_acquire) || closed_.load() || draining_.load()) {
      *error = absl::UnavailableError("the session stream is closed");
      return written;
    }
    // Buffered until the last one, which flushes them all.
    grpc::WriteOptions options;
    if (k + 1 < envelopes.size()) options.set_buffer_hint();
    if (!stream_->Write(envelopes[k], options)) {
      broken_.store(true, std::memory_order_release);
      *error = absl::UnavailableError("the session stream broke while writing");
      return written;
    }
  }
  return requests.size();
}

absl::Status SessionStream::Send(tensord::v1::SessionRequest request) {
  request.set_seq(0);
  return Write(request);
}

absl::Status SessionStream::SendQuiet(tensord::v1::SessionRequest request, std::string label) {
  absl::MutexLock write_lock(&write_mu_);
  if (broken_.load(std::memory_order_acquire) || closed_.load() || draining_.load()) {
    return absl::UnavailableError("the session stream is closed");
  }
  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    seq = next_seq_++;
    quiet_.push_back(QuietRequest{seq, std::move(label)});
  }
  request.set_seq(seq);
  if (!stream_->Write(request)) {
    broken_.store(true, std::memory_order_release);
    // Not written: the caller hears it now, not the failure handler later.
    absl::MutexLock lock(&mu_);
    if (!quiet_.empty() && quiet_.back().seq == seq) quiet_.pop_back();
    return absl::UnavailableError("the session stream broke while writing");
  }
  return absl::OkStatus();
}

size_t SessionStream::quiet_in_flight() {
  absl::MutexLock lock(&mu_);
  return quiet_.size();
}

absl::StatusOr<tensord::v1::SessionResponse> SessionStream::Call(
    tensord::v1::SessionRequest request, std::optional<Clock::time_point> deadline) {
  std::vector<tensord::v1::SessionRequest> one;
  one.push_back(std::move(request));
  return std::move(CallMany(std::move(one), deadline)[0]);
}

std::vector<absl::StatusOr<tensord::v1::SessionResponse>> SessionStream::CallMany(
    std::vector<tensord::v1::SessionRequest> requests, std::optional<Clock::time_point> deadline) {
  const size_t n = requests.size();
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> results;
  results.reserve(n);
  if (n == 0) return results;
  std::vector<Waiter> waiters(n);  // never resized: pending_ points into it
  std::vector<uint64_t> seqs(n, 0);
  size_t outstanding = n;
  absl::Status write_error;
  const size_t written = WriteAll(requests, waiters, seqs, &outstanding, &write_error);
  absl::MutexLock lock(&mu_);
  // What was not written fails now; what was written is answered, or failed by the reader
  // when the stream ends, so it is waited for.
  for (size_t i = written; i < n; ++i) {
    if (waiters[i].done) continue;
    if (seqs[i] != 0) pending_.erase(seqs[i]);
    waiters[i].outstanding = &outstanding;
    Complete(&waiters[i], write_error);
  }
  auto done = [&outstanding]() { return outstanding == 0; };
  if (deadline.has_value()) {
    mu_.AwaitWithDeadline(absl::Condition(&done), absl::FromChrono(
        std::chrono::system_clock::now() + (*deadline - Clock::now())));
  } else {
    mu_.Await(absl::Condition(&done));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!waiters[i].done) {
      // Too late now; a reply that still comes goes to the orphan handler.
      pending_.erase(seqs[i]);
      Complete(&waiters[i], absl::DeadlineExceededError(
                                "the broker did not answer on the session stream in time"));
    }
    results.push_back(std::move(waiters[i].result));
  }
  return results;
}

}  // namespace tensord::internal
