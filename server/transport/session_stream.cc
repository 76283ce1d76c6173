#include "server/transport/session_stream.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/protocol_limits.h"
#include "server/transport/grpc_status.h"
#include "server/transport/wire_messages.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

constexpr size_t kMaxQueuedResponses = 1024;  // stop reading requests beyond this
constexpr size_t kMaxQueuedPushes = 4096;      // beyond this: drop, then one cache_reset
// Messages queued together (replies and pushes) leave in one SessionResponse.batch of at
// most this many and about common::kMaxBatchBytes.
constexpr int kMaxBatchReplies = 4096;

// What the broker pushes unasked (counted against kMaxQueuedPushes); replies never have
// these bodies, whatever seq a client chose.
bool IsPush(const v1::SessionResponse& message) {
  return message.body_case() == v1::SessionResponse::kRetired ||
         message.body_case() == v1::SessionResponse::kCacheReset ||
         message.body_case() == v1::SessionResponse::kExportReleased;
}

// The reply to request `seq` that carries `status` as its error.
v1::SessionResponse ErrorReply(uint64_t seq, const absl::Status& status) {
  v1::SessionResponse response;
  response.set_seq(seq);
  response.mutable_error()->set_code(static_cast<int>(status.code()));
  response.mutable_error()->set_message(std::string(status.message()));
  return response;
}

// The reply to request `seq`: `result`'s value, moved where `place` points in the
// response, or its error.
template <typename Value, typename Place>
v1::SessionResponse Reply(uint64_t seq, absl::StatusOr<Value> result, Place place) {
  if (!result.ok()) return ErrorReply(seq, result.status());
  v1::SessionResponse response;
  response.set_seq(seq);
  *place(response) = std::move(*result);
  return response;
}

class SessionStream;

// The waits started on one stream, by the seq of the request that started each: what a
// CancelWaitsRequest and the stream's end cancel. Shared with the waits' completions, which
// forget theirs (and may outlive the stream). A client that reuses a seq has all its waits
// of that seq cancelled together.
class StreamWaits {
 public:
  // Before the broker call that may start a wait for request `seq`: the entry's key.
  uint64_t Begin(uint64_t seq) {
    absl::MutexLock lock(&mu_);
    const uint64_t key = next_key_++;
    waits_.emplace(seq, Entry{key, 0});
    return key;
  }
  // After it: the wait id it returned (0: it completed at once).
  void Started(uint64_t seq, uint64_t key, uint64_t wait_id) {
    absl::MutexLock lock(&mu_);
    auto it = FindLocked(seq, key);
    if (it == waits_.end()) return;  // completed already
    if (wait_id == 0) {
      waits_.erase(it);
    } else {
      it->second.wait_id = wait_id;
    }
  }
  // From the wait's completion.
  void Done(uint64_t seq, uint64_t key) {
    absl::MutexLock lock(&mu_);
    if (auto it = FindLocked(seq, key); it != waits_.end()) waits_.erase(it);
  }
  // The broker's ids of the pending waits of these requests, to cancel once mu_ is released
  // (a cancelled wait completes at once, and its completion calls Done).
  std::vector<uint64_t> WaitIdsOf(const google::protobuf::RepeatedField<uint64_t>& seqs) {
    std::vector<uint64_t> ids;
    absl::MutexLock lock(&mu_);
    for (uint64_t seq : seqs) {
      auto [first, last] = waits_.equal_range(seq);
      for (auto it = first; it != last; ++it) {
        if (it->second.wait_id != 0) ids.push_back(it->second.wait_id);
      }
    }
    return ids;
  }
  // Every pending wait's id, forgetting them all (the stream ends).
  std::vector<uint64_t> TakeAll() {
    std::vector<uint64_t> ids;
    absl::MutexLock lock(&mu_);
    for (const auto& [seq, entry] : waits_) {
      if (entry.wait_id != 0) ids.push_back(entry.wait_id);
    }
    waits_.clear();
    return ids;
  }

 private:
  struct Entry {
    uint64_t key;
    uint64_t wait_id;  // 0 while the broker call that starts it runs
  };
  using Map = std::multimap<uint64_t, Entry>;
  Map::iterator FindLocked(uint64_t seq, uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto [first, last] = waits_.equal_range(seq);
    for (auto it = first; it != last; ++it) {
      if (it->second.key == key) return it;
    }
    return waits_.end();
  }

  absl::Mutex mu_;
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
  Map waits_ ABSL_GUARDED_BY(mu_);  // by seq
};

// What the stream shares with the Broker (as its PushSink) and with wait completions,
// which may outlive the call.
class StreamOutbox final : public PushSink {
 public:
  explicit StreamOutbox(SessionStream* stream) : stream_(stream) {}
  bool Push(const v1::SessionResponse& message) override;
  void Close() override;
  void Respond(v1::SessionResponse message);
  // While corked (a batch request is being dispatched) nothing is written, so the batch's
  // replies that are ready at once leave together when the last Uncork() pumps.
  void Cork();
  void Uncork();
  // An acquire or take was dispatched: its reply is owed, and a stream the client
  // half-closed finishes only once every owed reply is written (a client draining its
  // stream before fork() relies on this: a wait granted while it drains is never lost).
  void ExpectReply();
  void RespondOwed(v1::SessionResponse message);
  // Drops everything queued and finishes with `status` once no write is in flight.
  void Abort(const absl::Status& status);

  // Reactor side.
  void OnWriteDone(bool ok);
  void OnReadsDone();
  bool ShouldPauseReads();
  void Detach() {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
  }

 private:
  // What Pump() decided, for its caller to do once mu_ is released (as the Broker's
  // Effects): start the next write (and resume reads), or finish the call.
  struct Effects {
    SessionStream* stream = nullptr;  // null: nothing to do
    const grpc::ByteBuffer* write = nullptr;  // in_flight_bytes_, while writing_ is set
    bool resume_reads = false;
    bool finish = false;
    grpc::Status status;  // with `finish`
  };
  // Decides the next write or the finish; the caller delivers them after unlocking.
  [[nodiscard]] Effects Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs what Pump() decided, without mu_. The stream cannot finish while a write is in
  // flight (writing_ set) or before the finish it is told, so it outlives these calls.
  static void Deliver(const Effects& effects);
  // Moves the next message to send into in_flight_: the front one, or, when more are
  // queued, as many as fit one batch, in order; counts the pushes it carries.
  void TakeNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  SessionStream* stream_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::SessionResponse> queue_ ABSL_GUARDED_BY(mu_);
  v1::SessionResponse in_flight_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer in_flight_bytes_ ABSL_GUARDED_BY(mu_);
  size_t pushes_queued_ ABSL_GUARDED_BY(mu_) = 0;
  size_t pushes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // in in_flight_, counted in pushes_queued_
  bool reset_owed_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  size_t owed_replies_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_paused_ ABSL_GUARDED_BY(mu_) = false;
  int corked_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

class SessionStream final : public ServerCall {
 public:
  SessionStream(Broker* broker, absl::StatusOr<uint64_t> session, RpcMetrics* metrics)
      : broker_(broker), session_(std::move(session)), metrics_(metrics) {}

  void OnStart() override {
    if (!session_.ok()) {
      Finish(ToGrpcStatus(session_.status()));
      return;
    }
    session_id_ = *session_;
    // Set before the broker can see it: from AttachSink on, a push may start a write whose
    // OnWriteDone (another thread) reads outbox_.
    outbox_ = std::make_shared<StreamOutbox>(this);
    absl::StatusOr<bool> reset_owed = broker_->AttachSink(session_id_, outbox_);
    if (!reset_owed.ok()) {
      outbox_->Detach();
      outbox_.reset();
      Finish(ToGrpcStatus(reset_owed.status()));
      return;
    }
    if (*reset_owed) {
      v1::SessionResponse reset;
      reset.set_cache_reset(true);
      outbox_->Push(reset);
    }
    StartRead(&request_bytes_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      CancelWaits();
      outbox_->OnReadsDone();
      return;
    }
    v1::SessionRequest request;
    if (absl::Status parsed = ParseRequest(request_bytes_, &request); !parsed.ok()) {
      // The client's stream is corrupt from here on: stop reading and say why.
      spdlog::debug("session {}: {}", session_id_, parsed.ToString());
      CancelWaits();
      outbox_->Abort(parsed);
      return;
    }
    request_bytes_.Clear();
    Dispatch(request);
    if (!outbox_->ShouldPauseReads()) StartRead(&request_bytes_);
  }
  void ResumeReads() { StartRead(&request_bytes_); }

  void OnWriteDone(bool ok) override { outbox_->OnWriteDone(ok); }

  void OnDone() override {
    if (outbox_ != nullptr) {
      CancelWaits();
      outbox_->Detach();
      broker_->DetachSink(session_id_, outbox_.get());
    }
  }

 private:
  void Dispatch(const v1::SessionRequest& request) {
    uint64_t seq = request.seq();
    std::shared_ptr<StreamOutbox> outbox = outbox_;
    switch (request.op_case()) {
      case v1::SessionRequest::kAcquire:
      case v1::SessionRequest::kTake: {
        bool take = request.op_case() == v1::SessionRequest::kTake;
        outbox->ExpectReply();
        // Only a request that asks to wait can start one; the others (most) keep no record.
        const bool may_wait = take ? AsksToWait(request.take()) : AsksToWait(request.acquire());
        const uint64_t key = may_wait ? waits_->Begin(seq) : 0;
        auto done = [outbox, waits = may_wait ? waits_ : nullptr, seq, key, take,
                     timer = Start(take ? RpcMethod::kTake : RpcMethod::kAcquire)](
                        absl::StatusOr<v1::AcquireResponse> result) {
          if (waits != nullptr) waits->Done(seq, key);
          timer.Done(result.status().code());
          outbox->RespondOwed(Reply(seq, std::move(result), [take](v1::SessionResponse& r) {
            return take ? r.mutable_take() : r.mutable_acquire();
          }));
        };
        uint64_t wait_id = take ? broker_->Take(session_id_, request.take(), std::move(done))
                                : broker_->Acquire(session_id_, request.acquire(), std::move(done));
        if (may_wait) waits_->Started(seq, key, wait_id);
        break;
      }
      case v1::SessionRequest::kCancelWaits: {
        const auto& seqs = request.cancel_waits().seqs();
        if (seqs.size() > common::kMaxBatchRequests) {
          // Only a broken client sends this.
          CancelWaits();
          outbox->Abort(absl::InvalidArgumentError(absl::StrCat(
              "a cancel of ", seqs.size(), " waits; at most ", common::kMaxBatchRequests)));
          break;
        }
        // Each cancelled wait answers its own request (CANCELLED); this one is not answered.
        for (uint64_t wait_id : waits_->WaitIdsOf(seqs)) broker_->CancelWait(wait_id);
        break;
      }
      case v1::SessionRequest::kRelease: {
        RpcMetrics::Timer timer = Start(RpcMethod::kRelease);
        absl::StatusOr<v1::ReleaseResponse> released = broker_->Release(session_id_, request.release());
        timer.Done(released.status().code());
        if (seq != 0) {
          outbox->Respond(Reply(seq, std::move(released),
                                [](v1::SessionResponse& r) { return r.mutable_release(); }));
        } else if (!released.ok()) {
          // No reply wanted: a refused batch is only logged.
          spdlog::debug("session {}: {}", session_id_, released.status().ToString());
        }
        break;
      }
      case v1::SessionRequest::kPublish: {
        RpcMetrics::Timer timer = Start(RpcMethod::kPublish);
        absl::StatusOr<v1::PublishResponse> published = broker_->Publish(session_id_, request.publish());
        timer.Done(published.status().code());
        // A quiet publish is answered only when it fails; its client counts a later
        // reply as the word that it worked.
        if (published.ok() && request.publish().quiet()) break;
        outbox->Respond(Reply(seq, std::move(published),
                              [](v1::SessionResponse& r) { return r.mutable_publish(); }));
        break;
      }
      case v1::SessionRequest::kHandOver: {
        RpcMetrics::Timer timer = Start(RpcMethod::kHandOver);
        absl::StatusOr<v1::HandOverResponse> handed = broker_->HandOver(session_id_, request.hand_over());
        timer.Done(handed.status().code());
        outbox->Respond(Reply(seq, std::move(handed), [](v1::SessionResponse& r) { return r.mutable_hand_over(); }));
        break;
      }
      case v1::SessionRequest::kAllocate: {
        // Completes on the broker's executor when a new buffer must be made; one that asks
        // for a slot of a full queue waits for it, and is cancelled as a waiting take is.
        outbox->ExpectReply();
        const bool may_wait = request.allocate().has_queue();
        const uint64_t key = may_wait ? waits_->Begin(seq) : 0;
        uint64_t wait_id = broker_->Allocate(
            session_id_, request.allocate(),
            [outbox, waits = may_wait ? waits_ : nullptr, seq, key,
             timer = Start(RpcMethod::kAllocate)](absl::StatusOr<v1::AllocateResponse> result) {
              if (waits != nullptr) waits->Done(seq, key);
              timer.Done(result.status().code());
              outbox->RespondOwed(
                  Reply(seq, std::move(result), [](v1::SessionResponse& r) { return r.mutable_allocate(); }));
            });
        if (may_wait) waits_->Started(seq, key, wait_id);
        break;
      }
      case v1::SessionRequest::kBatch: {
        const auto& requests = request.batch().requests();
        if (requests.size() > common::kMaxBatchRequests) {
          // Only a broken client sends this; its seqs would all go unanswered.
          CancelWaits();
          outbox->Abort(absl::InvalidArgumentError(
              absl::StrCat("a session batch of ", requests.size(), " requests; at most ",
                           common::kMaxBatchRequests)));
          break;
        }
        outbox->Cork();
        for (const v1::SessionRequest& inner : requests) {
          if (inner.op_case() == v1::SessionRequest::kBatch) {
            outbox->Respond(ErrorReply(inner.seq(), absl::InvalidArgumentError(
                                                        "a session batch inside a batch")));
            continue;
          }
          Dispatch(inner);
        }
        outbox->Uncork();
        break;
      }
      case v1::SessionRequest::OP_NOT_SET:
        outbox->Respond(ErrorReply(seq, absl::InvalidArgumentError("session request without an operation")));
        break;
    }
  }

  RpcMetrics::Timer Start(RpcMethod method) const { return RpcMetrics::Start(metrics_, method, RpcTransport::kSession); }

  void CancelWaits() {
    for (uint64_t id : waits_->TakeAll()) broker_->CancelWait(id);
  }

  Broker* const broker_;
  const absl::StatusOr<uint64_t> session_;
  RpcMetrics* const metrics_;
  uint64_t session_id_ = 0;
  std::shared_ptr<StreamOutbox> outbox_;
  grpc::ByteBuffer request_bytes_;
  // Waits started on this stream and not completed yet.
  const std::shared_ptr<StreamWaits> waits_ = std::make_shared<StreamWaits>();
};

bool StreamOutbox::Push(const v1::SessionResponse& message) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (finished_ || broken_ || closing_) return false;
    if (pushes_queued_ >= kMaxQueuedPushes) {
      reset_owed_ = true;  // the client stopped reading: one reset instead of a backlog
      return false;
    }
    ++pushes_queued_;
    queue_.push_back(message);
    effects = Pump();
  }
  Deliver(effects);
  return true;
}

void StreamOutbox::Respond(v1::SessionResponse message) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (finished_ || broken_) return;
    queue_.push_back(std::move(message));
    effects = Pump();
  }
  Deliver(effects);
}

void StreamOutbox::Cork() {
  absl::MutexLock lock(&mu_);
  ++corked_;
}

void StreamOutbox::Uncork() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (corked_ > 0) --corked_;
    effects = Pump();
  }
  Deliver(effects);
}

void StreamOutbox::ExpectReply() {
  absl::MutexLock lock(&mu_);
  ++owed_replies_;
}

void StreamOutbox::RespondOwed(v1::SessionResponse message) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (owed_replies_ > 0) --owed_replies_;
    if (finished_ || broken_) return;
    queue_.push_back(std::move(message));
    effects = Pump();
  }
  Deliver(effects);
}

void StreamOutbox::Close() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    effects = Pump();
  }
  Deliver(effects);
}

void StreamOutbox::Abort(const absl::Status& status) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    broken_ = true;
    queue_.clear();
    pushes_queued_ = 0;
    final_status_ = ToGrpcStatus(status);
    effects = Pump();
  }
  Deliver(effects);
}

void StreamOutbox::OnWriteDone(bool ok) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    pushes_queued_ -= std::min(pushes_queued_, pushes_in_flight_);
    pushes_in_flight_ = 0;
    if (!ok) {
      broken_ = true;
      queue_.clear();
      pushes_queued_ = 0;
    }
    if (reset_owed_ && pushes_queued_ < kMaxQueuedPushes / 2 && !broken_) {
      reset_owed_ = false;
      v1::SessionResponse reset;
      reset.set_cache_reset(true);
      ++pushes_queued_;
      queue_.push_back(std::move(reset));
    }
    effects = Pump();
  }
  Deliver(effects);
}

void StreamOutbox::OnReadsDone() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    reads_done_ = true;
    effects = Pump();
  }
  Deliver(effects);
}

bool StreamOutbox::ShouldPauseReads() {
  absl::MutexLock lock(&mu_);
  reads_paused_ = queue_.size() >= kMaxQueuedResponses;
  return reads_paused_;
}

void StreamOutbox::TakeNext() {
  in_flight_ = std::move(queue_.front());
  queue_.pop_front();
  pushes_in_flight_ = IsPush(in_flight_) ? 1 : 0;
  if (queue_.empty()) return;
  v1::SessionResponse batch;
  auto* messages = batch.mutable_batch()->mutable_responses();
  size_t bytes = in_flight_.ByteSizeLong();
  *messages->Add() = std::move(in_flight_);
  while (!queue_.empty() && messages->size() < kMaxBatchReplies) {
    bytes += queue_.front().ByteSizeLong();
    if (bytes > common::kMaxBatchBytes) break;
    if (IsPush(queue_.front())) ++pushes_in_flight_;
    *messages->Add() = std::move(queue_.front());
    queue_.pop_front();
  }
  in_flight_ = std::move(batch);
}

StreamOutbox::Effects StreamOutbox::Pump() {
  Effects effects;
  if (stream_ == nullptr || finished_ || writing_ || corked_ > 0) return effects;
  while (!queue_.empty() && !broken_) {
    TakeNext();
    if (absl::Status serialized = SerializeResponse(in_flight_, &in_flight_bytes_); !serialized.ok()) {
      spdlog::error("session stream: {}", serialized.ToString());
      pushes_queued_ -= std::min(pushes_queued_, pushes_in_flight_);
      pushes_in_flight_ = 0;
      continue;
    }
    writing_ = true;
    if (reads_paused_ && queue_.size() < kMaxQueuedResponses / 2) {
      reads_paused_ = false;
      effects.resume_reads = true;
    }
    effects.stream = stream_;
    effects.write = &in_flight_bytes_;
    return effects;
  }
  if (((reads_done_ && owed_replies_ == 0) || closing_ || broken_) && queue_.empty()) {
    finished_ = true;
    effects.stream = stream_;
    effects.finish = true;
    effects.status = final_status_;
  }
  return effects;
}

void StreamOutbox::Deliver(const Effects& effects) {
  if (effects.stream == nullptr) return;
  if (effects.write != nullptr) {
    effects.stream->StartWrite(effects.write);
    if (effects.resume_reads) effects.stream->ResumeReads();
  }
  if (effects.finish) effects.stream->Finish(effects.status);
}

}  // namespace

std::unique_ptr<ServerCall> NewSessionStream(Broker* broker, absl::StatusOr<uint64_t> session, RpcMetrics* metrics) {
  return std::make_unique<SessionStream>(broker, std::move(session), metrics);
}

}  // namespace tensord::server
