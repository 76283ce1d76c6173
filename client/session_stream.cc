#include "client/session_stream.h"

#include <algorithm>
#include <span>
#include <utility>

#include "client/cancel_state.h"
#include "client/status_util.h"
#include "common/protocol_limits.h"
#include "common/status.h"
#include "grpc/support/time.h"

namespace tensord::internal {
namespace {

// Completion-queue tags: which operation completed.
enum class Op : intptr_t { kStart = 1, kRead, kWrite, kWritesDone, kFinish };
void* TagOf(Op op) { return reinterpret_cast<void*>(static_cast<intptr_t>(op)); }
Op OpOf(void* tag) { return static_cast<Op>(reinterpret_cast<intptr_t>(tag)); }

// How long the background thread leaves the role to callers after they were active.
constexpr std::chrono::milliseconds kBackgroundPause{1};
// How long one wait of the background poller lasts when nothing happens (it re-checks
// whether it should stop).
constexpr auto kBackgroundPollSlice = std::chrono::milliseconds(500);

gpr_timespec ToGpr(std::optional<SessionStream::Clock::time_point> deadline) {
  if (!deadline.has_value()) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
      *deadline - SessionStream::Clock::now());
  if (left.count() <= 0) return gpr_time_0(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_micros(left.count(), GPR_TIMESPAN));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionStream>> SessionStream::Open(tensord::v1::Broker::Stub* stub,
                                                                   const std::string& session_token,
                                                                   Handler on_push,
                                                                   Handler on_orphan,
                                                                   QuietFailureHandler on_quiet_failure) {
  std::unique_ptr<SessionStream> s(new SessionStream(std::move(on_push), std::move(on_orphan),
                                                     std::move(on_quiet_failure)));
  s->cq_ = std::make_unique<grpc::CompletionQueue>();
  s->context_ = std::make_unique<grpc::ClientContext>();
  s->context_->AddMetadata("tensord-session", session_token);
  SessionStream* raw = s.get();
  {
    absl::MutexLock lock(&s->mu_);
    s->stream_ = stub->AsyncSession(s->context_.get(), s->cq_.get(), TagOf(Op::kStart));
    if (s->stream_ == nullptr) return absl::UnavailableError("could not open the session stream");
    ++s->ops_in_flight_;
  }
  // Until the call is under way (its headers sent): a cancel before that may never reach
  // the broker, which would keep the stream until its shutdown grace runs out.
  const bool started = s->WaitUntil(
      [raw]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(raw->mu_) { return raw->started_; },
      Clock::now() + std::chrono::seconds(10));
  // Close() (the destructor) cancels what did not start and collects its operations.
  if (!started) return absl::UnavailableError("the session stream did not start within 10 s");
  s->background_ = std::thread([raw] { raw->BackgroundLoop(); });
  return s;
}

SessionStream::~SessionStream() { Close(); }

void SessionStream::Close() {
  if (closed_.exchange(true)) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (context_ != nullptr) context_->TryCancel();
  if (background_.joinable()) background_.join();
  if (stream_ != nullptr) {
    // Every operation started must come back before the queue can go.
    WaitUntil([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ && ops_in_flight_ == 0; },
              std::nullopt);
  }
  cq_->Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_->Next(&tag, &ok)) {
  }
}

void SessionStream::Drain(Clock::time_point deadline) {
  if (closed_.load()) return;
  draining_.store(true);
  {
    absl::MutexLock lock(&mu_);
    StartNextWriteLocked();  // the half-close, once the queued writes are out
  }
  WaitUntil([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_; }, deadline);
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
  new std::thread(std::move(background_));  // leaked on purpose: no such thread in the child
  (void)context_.release();
  (void)stream_.release();
  (void)cq_.release();
}

void SessionStream::TimeOutLocked(uint64_t seq, Waiter* waiter) {
  if (waiter->done) return;
  pending_.erase(seq);
  Complete(waiter, absl::DeadlineExceededError("the broker did not answer on the session stream in time"));
}

void SessionStream::Complete(Waiter* waiter,
                             absl::StatusOr<tensord::v1::SessionResponse> result) {
  waiter->result = std::move(result);
  waiter->done = true;
  --*waiter->outstanding;
}

absl::Status SessionStream::RefuseWrites() const {
  if (broken_.load(std::memory_order_acquire)) return ClosedStatus();
  if (closed_.load() || draining_.load()) {
    return absl::UnavailableError("the session stream is closed");
  }
  return absl::OkStatus();
}

void SessionStream::EnqueueLocked(tensord::v1::SessionRequest message) {
  outbox_.push_back(std::move(message));
  StartNextWriteLocked();
}

void SessionStream::StartNextWriteLocked() {
  if (write_in_flight_ || finish_started_ || broken_.load(std::memory_order_acquire)) return;
  if (!outbox_.empty()) {
    // gRPC serializes the message here; it need not outlive the call.
    stream_->Write(outbox_.front(), TagOf(Op::kWrite));
    outbox_.pop_front();
  } else if (draining_.load() && !writes_done_started_) {
    stream_->WritesDone(TagOf(Op::kWritesDone));
    writes_done_started_ = true;
  } else {
    return;
  }
  write_in_flight_ = true;
  ++ops_in_flight_;
}

void SessionStream::StartFinishLocked() {
  if (finish_started_) return;
  finish_started_ = true;
  broken_.store(true, std::memory_order_release);
  outbox_.clear();
  stream_->Finish(&finish_status_, TagOf(Op::kFinish));
  ++ops_in_flight_;
}

std::vector<absl::Status> SessionStream::OnFinishedLocked() {
  finished_ = true;
  broken_.store(true, std::memory_order_release);
  const grpc::Status& status = finish_status_;
  std::string message = "the session stream ended: " +
                        (status.ok() ? std::string("the broker closed it")
                                     : FromGrpc(status).ToString());
  end_message_ = message;
  for (auto& [seq, waiter] : pending_) Complete(waiter, absl::UnavailableError(message));
  pending_.clear();
  std::deque<QuietRequest> unconfirmed;
  // A drain that ended cleanly means the broker read and handled everything written.
  if (!(draining_.load() && status.ok())) unconfirmed = std::move(quiet_);
  quiet_.clear();
  std::vector<absl::Status> lost;
  if (!on_quiet_failure_) return lost;
  for (const QuietRequest& request : unconfirmed) {
    lost.push_back(absl::UnavailableError(
        request.label + ": sent without waiting, and " + message +
        " before the broker confirmed it; it may not have happened"));
  }
  return lost;
}

void SessionStream::ReportQuietFailures(std::vector<absl::Status> failures) {
  for (absl::Status& failure : failures) on_quiet_failure_(std::move(failure));
}

SessionStream::Completion SessionStream::NextCompletion(gpr_timespec deadline) {
  Completion completion;
  if (cq_->AsyncNext(&completion.tag, &completion.ok, deadline) != grpc::CompletionQueue::GOT_EVENT) {
    return completion;
  }
  completion.got = true;
  if (OpOf(completion.tag) == Op::kRead && completion.ok) {
    // Only the poller touches the message, so it is handled without the lock.
    completion.replied = HandleMessage(read_message_);
    read_message_.Clear();
  }
  return completion;
}

SessionStream::Polled SessionStream::OnCompletionLocked(const Completion& completion,
                                                        std::vector<absl::Status>* lost) {
  if (!completion.got) return Polled::kNothing;
  const bool ok = completion.ok;
  --ops_in_flight_;
  switch (OpOf(completion.tag)) {
    case Op::kStart:
      started_ = true;
      write_in_flight_ = false;
      if (!ok) {
        StartFinishLocked();
        break;
      }
      stream_->Read(&read_message_, TagOf(Op::kRead));
      ++ops_in_flight_;
      StartNextWriteLocked();
      break;
    case Op::kRead:
      if (!ok) {
        // No more messages: the stream is over, and Finish says why.
        StartFinishLocked();
        break;
      }
      stream_->Read(&read_message_, TagOf(Op::kRead));
      ++ops_in_flight_;
      break;
    case Op::kWrite:
    case Op::kWritesDone:
      write_in_flight_ = false;
      // A failed write means the call is over; the pending read fails too and finishes it.
      if (!ok) broken_.store(true, std::memory_order_release);
      StartNextWriteLocked();
      return Polled::kWriteDone;
    case Op::kFinish:
      *lost = OnFinishedLocked();
      break;
  }
  return completion.replied ? Polled::kReply : Polled::kOther;
}

bool SessionStream::WaitUntil(const std::function<bool()>& done,
                              std::optional<Clock::time_point> deadline) {
  mu_.Lock();
  bool met = true;
  while (!done()) {
    if (deadline.has_value() && Clock::now() >= *deadline) {
      met = false;
      break;
    }
    if (!polling_) {
      // The role is free: wait for a completion without the lock, then handle it under it.
      polling_ = true;
      mu_.Unlock();
      const Completion completion = NextCompletion(ToGpr(deadline));
      mu_.Lock();
      std::vector<absl::Status> lost;
      OnCompletionLocked(completion, &lost);
      if (!lost.empty()) {  // the stream ended
        mu_.Unlock();
        ReportQuietFailures(std::move(lost));
        mu_.Lock();
      }
      polling_ = false;
      last_caller_poll_ = Clock::now();
      continue;
    }
    // Someone else polls: wait until it handed us what we wait for, or left the role.
    auto wake = [this, &done]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done() || !polling_; };
    if (deadline.has_value()) {
      mu_.AwaitWithDeadline(absl::Condition(&wake),
                            absl::FromChrono(std::chrono::system_clock::now() +
                                             (*deadline - Clock::now())));
    } else {
      mu_.Await(absl::Condition(&wake));
    }
  }
  mu_.Unlock();
  return met;
}

bool SessionStream::ClaimPollerForQueuedWritesLocked() {
  // Only a write queued behind one in flight needs the poll; a message that went straight
  // out leaves its completion for the next poll, and a poll that finds nothing costs a
  // syscall.
  if (polling_ || outbox_.empty()) return false;  // the poller will see the completions
  polling_ = true;
  return true;
}

void SessionStream::PollReady() {
  for (;;) {
    const Completion completion = NextCompletion(gpr_time_0(GPR_CLOCK_MONOTONIC));
    mu_.Lock();
    std::vector<absl::Status> lost;
    const Polled polled = OnCompletionLocked(completion, &lost);
    if (!lost.empty()) {  // the stream ended
      mu_.Unlock();
      ReportQuietFailures(std::move(lost));
      mu_.Lock();
    }
    if (polled == Polled::kNothing || outbox_.empty()) break;
    mu_.Unlock();
  }
  polling_ = false;
  last_caller_poll_ = Clock::now();
  mu_.Unlock();
}

void SessionStream::BackgroundLoop() {
  mu_.Lock();
  auto role_free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !polling_ || stop_ || finished_;
  };
  while (!stop_ && !finished_) {
    // Callers poll, or did a moment ago: they read pushes as they go. Taking the role between
    // two of their calls would cost the next one a hand-over. Sleep until the role is free
    // and then until the pause after the last caller's poll is over, never on a clock tick:
    // a caller blocked in a long wait costs this thread no wake-ups.
    if (polling_) {
      mu_.Await(absl::Condition(&role_free));
      continue;
    }
    const Clock::duration quiet_in = last_caller_poll_ + kBackgroundPause - Clock::now();
    if (quiet_in > Clock::duration::zero()) {
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(quiet_in));
      continue;
    }
    polling_ = true;
    Polled polled = Polled::kNothing;
    while (!stop_ && !finished_) {
      mu_.Unlock();
      const Completion completion = NextCompletion(ToGpr(Clock::now() + kBackgroundPollSlice));
      mu_.Lock();
      std::vector<absl::Status> lost;
      polled = OnCompletionLocked(completion, &lost);
      if (!lost.empty()) {  // the stream ended
        mu_.Unlock();
        ReportQuietFailures(std::move(lost));
        mu_.Lock();
      }
      // Callers are active (a reply for one of them, or a write): leave the role to them.
      if (polled == Polled::kReply || polled == Polled::kWriteDone) break;
    }
    polling_ = false;
    if (polled == Polled::kReply || polled == Polled::kWriteDone) {
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(kBackgroundPause));
    }
  }
  mu_.Unlock();
}

bool SessionStream::Deliver(std::span<tensord::v1::SessionResponse* const> replies) {
  if (replies.empty()) return false;
  std::vector<tensord::v1::SessionResponse*> orphans;
  std::vector<absl::Status> quiet_failures;
  bool delivered = false;
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
      delivered = true;
    }
  }
  if (on_orphan_) {
    for (tensord::v1::SessionResponse* orphan : orphans) on_orphan_(*orphan);
  }
  if (on_quiet_failure_) {
    for (absl::Status& failure : quiet_failures) on_quiet_failure_(std::move(failure));
  }
  return delivered;
}

bool SessionStream::HandleMessage(tensord::v1::SessionResponse& message) {
  if (message.has_batch()) {
    // Messages queued together, handled in their order: each run of replies is delivered
    // under one lock, each push in between goes to the push handler.
    bool delivered = false;
    std::vector<tensord::v1::SessionResponse*> replies;
    for (auto& inner : *message.mutable_batch()->mutable_responses()) {
      if (inner.seq() != 0) {
        replies.push_back(&inner);
        continue;
      }
      delivered |= Deliver(replies);
      replies.clear();
      if (on_push_) on_push_(inner);
    }
    return Deliver(replies) || delivered;
  }
  if (message.seq() == 0) {
    if (on_push_) on_push_(message);
    return false;
  }
  tensord::v1::SessionResponse* const one = &message;
  return Deliver(std::span<tensord::v1::SessionResponse* const>(&one, 1));
}

absl::Status SessionStream::ClosedStatus() const {
  return absl::UnavailableError(end_message_.empty() ? "the session stream is closed"
                                                     : end_message_);
}

absl::Status SessionStream::Send(tensord::v1::SessionRequest request) {
  request.set_seq(0);
  bool poll = false;
  {
    absl::MutexLock lock(&mu_);
    TENSORD_RETURN_IF_ERROR(RefuseWrites());
    EnqueueLocked(std::move(request));
    // Nobody may be polling to start the writes queued behind one in flight.
    poll = ClaimPollerForQueuedWritesLocked();
  }
  if (poll) PollReady();
  return absl::OkStatus();
}

absl::Status SessionStream::SendQuiet(tensord::v1::SessionRequest request, std::string label) {
  bool poll = false;
  {
    absl::MutexLock lock(&mu_);
    TENSORD_RETURN_IF_ERROR(RefuseWrites());
    const uint64_t seq = next_seq_++;
    quiet_.push_back(QuietRequest{seq, std::move(label)});
    request.set_seq(seq);
    EnqueueLocked(std::move(request));
    poll = ClaimPollerForQueuedWritesLocked();
  }
  if (poll) PollReady();
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
    std::vector<tensord::v1::SessionRequest> requests, std::optional<Clock::time_point> deadline,
    CancelState* cancel) {
  const size_t n = requests.size();
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> results;
  results.reserve(n);
  if (n == 0) return results;
  if (cancel != nullptr && cancel->cancelled()) {
    results.assign(n, CancelState::CancelledStatus());
    return results;
  }
  std::vector<Waiter> waiters(n);  // never resized: pending_ points into it
  std::vector<uint64_t> seqs(n, 0);
  size_t outstanding = n;  // under mu_
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status refused = RefuseWrites(); !refused.ok()) {
      results.assign(n, refused);
      return results;
    }
    // Seqs in write order (the queue keeps it).
    for (size_t i = 0; i < n; ++i) {
      seqs[i] = next_seq_++;
      requests[i].set_seq(seqs[i]);
      waiters[i].outstanding = &outstanding;
      pending_[seqs[i]] = &waiters[i];
    }
    EnqueueBatchLocked(requests);
  }
  AwaitReplies(waiters, seqs, outstanding, deadline, cancel);
  CollectResults(waiters, cancel, results);
  return results;
}

void SessionStream::EnqueueBatchLocked(std::vector<tensord::v1::SessionRequest>& requests) {
  if (requests.size() == 1) {
    EnqueueLocked(std::move(requests[0]));
    return;
  }
  // One message for the lot (in chunks the broker accepts), so a batch costs the broker and
  // the transport one read instead of one per request.
  tensord::v1::SessionRequest envelope;
  size_t bytes = 0;
  for (tensord::v1::SessionRequest& request : requests) {
    const size_t size = request.ByteSizeLong();
    if (envelope.batch().requests_size() > 0 &&
        (envelope.batch().requests_size() >= common::kMaxBatchRequests ||
         bytes + size > common::kMaxBatchBytes)) {
      EnqueueLocked(std::exchange(envelope, {}));
      bytes = 0;
    }
    bytes += size;
    *envelope.mutable_batch()->add_requests() = std::move(request);
  }
  EnqueueLocked(std::move(envelope));
}

void SessionStream::AwaitReplies(std::span<Waiter> waiters, const std::vector<uint64_t>& seqs,
                                 const size_t& outstanding, std::optional<Clock::time_point> deadline,
                                 CancelState* cancel) {
  uint64_t registration = 0;
  if (cancel != nullptr) {
    // Holds only values: it may run after this call returned, and then cancels nothing.
    registration = cancel->Register([weak = weak_from_this(), seqs] {
      if (std::shared_ptr<SessionStream> stream = weak.lock()) stream->SendCancel(seqs);
    });
  }
  auto all_done = [&outstanding]() { return outstanding == 0; };
  const bool met = cancel != nullptr ? WaitCancellable(all_done, deadline, *cancel) : WaitUntil(all_done, deadline);
  if (!met) {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < waiters.size(); ++i) TimeOutLocked(seqs[i], &waiters[i]);
  }
  if (cancel != nullptr) cancel->Unregister(registration);
}

void SessionStream::CollectResults(std::span<Waiter> waiters, CancelState* cancel,
                                   std::vector<absl::StatusOr<tensord::v1::SessionResponse>>& results) {
  // Every waiter is done and out of pending_: nothing else touches them any more.
  const bool cancelled = cancel != nullptr && cancel->cancelled();
  for (Waiter& waiter : waiters) {
    absl::StatusOr<tensord::v1::SessionResponse>& result = waiter.result;
    if (cancelled) {
      // A grant that raced the cancel is nobody's: the orphan handler releases it.
      if (result.ok() && !result->has_error() && on_orphan_) on_orphan_(*result);
      result = CancelState::CancelledStatus();
    }
    results.push_back(std::move(result));
  }
}

bool SessionStream::WaitCancellable(const std::function<bool()>& done,
                                    std::optional<Clock::time_point> deadline, CancelState& cancel) {
  const std::optional<std::chrono::milliseconds> period = cancel.poll_period();
  if (period.has_value()) {
    // The poll runs only once a period passed: an answer that comes at once costs none.
    for (;;) {
      std::optional<Clock::time_point> wake = Clock::now() + *period;
      if (deadline.has_value() && *deadline < *wake) wake = deadline;
      if (WaitUntil(done, wake)) return true;
      if (deadline.has_value() && Clock::now() >= *deadline) return false;
      if (cancel.Poll()) break;
    }
  } else if (WaitUntil(done, deadline)) {
    return true;
  }
  // Cancelled: the broker answers at once. One that does not know the cancel never will.
  std::optional<Clock::time_point> grace = Clock::now() + kCancelGrace;
  if (deadline.has_value() && *deadline < *grace) grace = deadline;
  return WaitUntil(done, grace);
}

void SessionStream::SendCancel(const std::vector<uint64_t>& seqs) {
  for (size_t at = 0; at < seqs.size(); at += common::kMaxBatchRequests) {
    tensord::v1::SessionRequest request;
    const size_t end = std::min(seqs.size(), at + common::kMaxBatchRequests);
    for (size_t i = at; i < end; ++i) request.mutable_cancel_waits()->add_seqs(seqs[i]);
    // A stream that broke meanwhile has failed the call already.
    (void)Send(std::move(request));
  }
}

absl::StatusOr<std::unique_ptr<SessionStream::PendingCall>> SessionStream::Start(
    std::shared_ptr<SessionStream> stream, tensord::v1::SessionRequest request) {
  SessionStream& s = *stream;
  std::unique_ptr<PendingCall> call(new PendingCall(std::move(stream)));
  call->waiter_.outstanding = &call->outstanding_;
  bool poll = false;
  {
    absl::MutexLock lock(&s.mu_);
    TENSORD_RETURN_IF_ERROR(s.RefuseWrites());
    call->seq_ = s.next_seq_++;
    request.set_seq(call->seq_);
    s.pending_[call->seq_] = &call->waiter_;
    s.EnqueueLocked(std::move(request));
    // Nobody may be polling to start the writes queued behind one in flight.
    poll = s.ClaimPollerForQueuedWritesLocked();
  }
  if (poll) s.PollReady();
  return call;
}

absl::StatusOr<tensord::v1::SessionResponse> SessionStream::PendingCall::Await(
    std::optional<Clock::time_point> deadline) {
  SessionStream& s = *stream_;
  if (!s.WaitUntil([this]() { return outstanding_ == 0; }, deadline)) {
    absl::MutexLock lock(&s.mu_);
    s.TimeOutLocked(seq_, &waiter_);
  }
  awaited_ = true;
  // Done and out of pending_: nothing else touches the waiter any more.
  return std::move(waiter_.result);
}

SessionStream::PendingCall::~PendingCall() {
  if (awaited_) return;
  SessionStream& s = *stream_;
  {
    absl::MutexLock lock(&s.mu_);
    if (!waiter_.done) {
      // The reply has not come: when it does, nobody waits for it.
      s.pending_.erase(seq_);
      return;
    }
  }
  if (waiter_.result.ok() && s.on_orphan_) s.on_orphan_(*waiter_.result);
}

}  // namespace tensord::internal
