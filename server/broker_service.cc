#include "server/broker_service.h"

#include <deque>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "server/grpc_status.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

constexpr char kSessionMetadata[] = "tensord-session";
constexpr size_t kMaxQueuedResponses = 1024;  // stop reading requests beyond this
constexpr size_t kMaxQueuedPushes = 4096;      // beyond this: drop, then one cache_reset
constexpr size_t kMaxQueuedWatchEvents = 4096;

absl::StatusOr<uint64_t> Authenticate(Broker* broker, grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kSessionMetadata);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "missing 'tensord-session' metadata: open a session on the fd channel first");
  }
  return broker->Authenticate(std::string_view(it->second.data(), it->second.size()));
}

// A unary call answered right away.
grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

template <typename Response>
grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     absl::StatusOr<Response> result, Response* response) {
  if (result.ok()) *response = std::move(*result);
  return FinishNow(context, result.status());
}

// A unary Acquire/Take that may wait. The wait is cancelled when the client cancels.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  struct State {
    absl::Mutex mu;
    uint64_t wait_id ABSL_GUARDED_BY(mu) = 0;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
  };

  WaitReactor(Broker* broker, v1::AcquireResponse* response)
      : broker_(broker), response_(response), state_(std::make_shared<State>()) {}

  template <typename Start>
  void Begin(Start start) {
    std::shared_ptr<State> state = state_;  // `this` may be gone once start() returns
    Broker* broker = broker_;
    uint64_t id = start([this](absl::StatusOr<v1::AcquireResponse> result) {
      if (result.ok()) *response_ = std::move(*result);
      Finish(ToGrpcStatus(result.status()));
    });
    bool cancel_now = false;
    {
      absl::MutexLock lock(&state->mu);
      state->wait_id = id;
      cancel_now = state->cancelled && id != 0;
    }
    if (cancel_now) broker->CancelWait(id);
  }

  void OnCancel() override {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&state_->mu);
      state_->cancelled = true;
      id = state_->wait_id;
    }
    if (id != 0) broker_->CancelWait(id);
  }
  void OnDone() override { delete this; }

 private:
  Broker* const broker_;
  v1::AcquireResponse* const response_;
  std::shared_ptr<State> state_;
};

// ---------------------------------------------------------------------------------------
// The Session stream

class SessionStream;

// What the stream shares with the Broker (as its PushSink) and with wait completions,
// which may outlive the reactor.
class StreamOutbox final : public PushSink {
 public:
  explicit StreamOutbox(SessionStream* stream) : stream_(stream) {}
  bool Push(const v1::SessionResponse& message) override;
  void Close() override;
  void Respond(v1::SessionResponse message);
  // An acquire or take was dispatched: its reply is owed, and a stream the client
  // half-closed finishes only once every owed reply is written (a client draining its
  // stream before fork() relies on this: a wait granted while it drains is never lost).
  void ExpectReply();
  void RespondOwed(v1::SessionResponse message);

  // Reactor side.
  void OnWriteDone(bool ok);
  void OnReadsDone();
  bool ShouldPauseReads();
  void Detach() {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
  }

 private:
  // Starts the next write or the finish; both run after the lock is dropped.
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Enqueue(v1::SessionResponse message, bool push);

  absl::Mutex mu_;
  SessionStream* stream_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::SessionResponse> queue_ ABSL_GUARDED_BY(mu_);
  v1::SessionResponse in_flight_ ABSL_GUARDED_BY(mu_);
  size_t pushes_queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool reset_owed_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  size_t owed_replies_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_paused_ ABSL_GUARDED_BY(mu_) = false;
};

class SessionStream final
    : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse> {
 public:
  SessionStream(Broker* broker, grpc::CallbackServerContext* context) : broker_(broker) {
    absl::StatusOr<uint64_t> session = Authenticate(broker, context);
    if (!session.ok()) {
      Finish(ToGrpcStatus(session.status()));
      return;
    }
    session_id_ = *session;
    outbox_ = std::make_shared<StreamOutbox>(this);
    if (broker_->AttachSink(session_id_, outbox_)) {
      v1::SessionResponse reset;
      reset.set_cache_reset(true);
      outbox_->Push(reset);
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      CancelWaits();
      outbox_->OnReadsDone();
      return;
    }
    Dispatch(request_);
    if (!outbox_->ShouldPauseReads()) StartRead(&request_);
  }
  void ResumeReads() { StartRead(&request_); }

  void OnWriteDone(bool ok) override { outbox_->OnWriteDone(ok); }

  void OnDone() override {
    if (outbox_ != nullptr) {
      CancelWaits();
      outbox_->Detach();
      broker_->DetachSink(session_id_, outbox_.get());
    }
    delete this;
  }

 private:
  void Dispatch(const v1::SessionRequest& request) {
    uint64_t seq = request.seq();
    std::shared_ptr<StreamOutbox> outbox = outbox_;
    auto respond_error = [&](const absl::Status& status) {
      v1::SessionResponse response;
      response.set_seq(seq);
      response.mutable_error()->set_code(static_cast<int>(status.code()));
      response.mutable_error()->set_message(std::string(status.message()));
      outbox->Respond(std::move(response));
    };
    switch (request.op_case()) {
      case v1::SessionRequest::kAcquire:
      case v1::SessionRequest::kTake: {
        bool take = request.op_case() == v1::SessionRequest::kTake;
        outbox->ExpectReply();
        auto done = [outbox, seq, take](absl::StatusOr<v1::AcquireResponse> result) {
          v1::SessionResponse response;
          response.set_seq(seq);
          if (result.ok()) {
            *(take ? response.mutable_take() : response.mutable_acquire()) = std::move(*result);
          } else {
            response.mutable_error()->set_code(static_cast<int>(result.status().code()));
            response.mutable_error()->set_message(std::string(result.status().message()));
          }
          outbox->RespondOwed(std::move(response));
        };
        uint64_t wait_id = take ? broker_->Take(session_id_, request.take(), std::move(done))
                                : broker_->Acquire(session_id_, request.acquire(), std::move(done));
        if (wait_id != 0) {
          absl::MutexLock lock(&waits_mu_);
          waits_.insert(wait_id);
        }
        break;
      }
      case v1::SessionRequest::kRelease: {
        v1::ReleaseResponse released = broker_->Release(session_id_, request.release());
        if (seq != 0) {
          v1::SessionResponse response;
          response.set_seq(seq);
          *response.mutable_release() = std::move(released);
          outbox->Respond(std::move(response));
        }
        break;
      }
      case v1::SessionRequest::kPublish: {
        absl::StatusOr<v1::PublishResponse> published = broker_->Publish(session_id_, request.publish());
        if (!published.ok()) {
          respond_error(published.status());
          break;
        }
        v1::SessionResponse response;
        response.set_seq(seq);
        *response.mutable_publish() = std::move(*published);
        outbox->Respond(std::move(response));
        break;
      }
      case v1::SessionRequest::OP_NOT_SET:
        respond_error(absl::InvalidArgumentError("session request without an operation"));
        break;
    }
  }

  void CancelWaits() {
    absl::flat_hash_set<uint64_t> waits;
    {
      absl::MutexLock lock(&waits_mu_);
      waits.swap(waits_);
    }
    for (uint64_t id : waits) broker_->CancelWait(id);
  }

  Broker* const broker_;
  uint64_t session_id_ = 0;
  std::shared_ptr<StreamOutbox> outbox_;
  v1::SessionRequest request_;
  absl::Mutex waits_mu_;
  // Waits started on this stream; completed ids may linger here and cancel as no-ops.
  absl::flat_hash_set<uint64_t> waits_ ABSL_GUARDED_BY(waits_mu_);
};

bool StreamOutbox::Push(const v1::SessionResponse& message) {
  absl::MutexLock lock(&mu_);
  if (finished_ || broken_ || closing_) return false;
  if (pushes_queued_ >= kMaxQueuedPushes) {
    reset_owed_ = true;  // the client stopped reading: one reset instead of a backlog
    return false;
  }
  ++pushes_queued_;
  queue_.push_back(message);
  Pump();
  return true;
}

void StreamOutbox::Respond(v1::SessionResponse message) {
  absl::MutexLock lock(&mu_);
  if (finished_ || broken_) return;
  queue_.push_back(std::move(message));
  Pump();
}

void StreamOutbox::ExpectReply() {
  absl::MutexLock lock(&mu_);
  ++owed_replies_;
}

void StreamOutbox::RespondOwed(v1::SessionResponse message) {
  absl::MutexLock lock(&mu_);
  if (owed_replies_ > 0) --owed_replies_;
  if (finished_ || broken_) return;
  queue_.push_back(std::move(message));
  Pump();
}

void StreamOutbox::Close() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  Pump();
}

void StreamOutbox::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  if (in_flight_.seq() == 0 && in_flight_.has_retired()) --pushes_queued_;
  if (!ok) {
    broken_ = true;
    queue_.clear();
  }
  if (reset_owed_ && pushes_queued_ < kMaxQueuedPushes / 2 && !broken_) {
    reset_owed_ = false;
    v1::SessionResponse reset;
    reset.set_cache_reset(true);
    queue_.push_back(std::move(reset));
  }
  Pump();
}

void StreamOutbox::OnReadsDone() {
  absl::MutexLock lock(&mu_);
  reads_done_ = true;
  Pump();
}

bool StreamOutbox::ShouldPauseReads() {
  absl::MutexLock lock(&mu_);
  reads_paused_ = queue_.size() >= kMaxQueuedResponses;
  return reads_paused_;
}

void StreamOutbox::Pump() {
  SessionStream* stream = stream_;
  if (stream == nullptr || finished_ || writing_) return;
  bool resume = false;
  if (!queue_.empty() && !broken_) {
    in_flight_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    if (reads_paused_ && queue_.size() < kMaxQueuedResponses / 2) {
      reads_paused_ = false;
      resume = true;
    }
    const v1::SessionResponse* message = &in_flight_;
    // The stream cannot finish while writing_ is set, so it outlives these calls.
    mu_.Unlock();
    stream->StartWrite(message);
    if (resume) stream->ResumeReads();
    mu_.Lock();
    return;
  }
  if (((reads_done_ && owed_replies_ == 0) || closing_ || broken_) && queue_.empty()) {
    finished_ = true;
    mu_.Unlock();
    stream->Finish(grpc::Status::OK);
    mu_.Lock();
  }
}

// ---------------------------------------------------------------------------------------
// Watch

class WatchStream;

class WatchOutbox final : public WatchSink {
 public:
  explicit WatchOutbox(WatchStream* stream) : stream_(stream) {}
  bool Push(const v1::WatchEvent& event) override;
  void Close() override;
  void OnWriteDone(bool ok);
  void Cancel();
  void Detach() {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
  }

 private:
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  WatchStream* stream_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::WatchEvent> queue_ ABSL_GUARDED_BY(mu_);
  v1::WatchEvent in_flight_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reset_owed_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

class WatchStream final : public grpc::ServerWriteReactor<v1::WatchEvent> {
 public:
  WatchStream(Broker* broker, grpc::CallbackServerContext* context, const v1::WatchRequest& request)
      : broker_(broker) {
    absl::StatusOr<uint64_t> session = Authenticate(broker, context);
    if (!session.ok()) {
      Finish(ToGrpcStatus(session.status()));
      return;
    }
    outbox_ = std::make_shared<WatchOutbox>(this);
    absl::StatusOr<uint64_t> id = broker_->AddWatcher(*session, request, outbox_);
    if (!id.ok()) {
      outbox_.reset();
      Finish(ToGrpcStatus(id.status()));
      return;
    }
    watcher_id_ = *id;
  }
  void OnWriteDone(bool ok) override { outbox_->OnWriteDone(ok); }
  void OnCancel() override {
    if (outbox_ != nullptr) outbox_->Cancel();
  }
  void OnDone() override {
    if (outbox_ != nullptr) {
      broker_->RemoveWatcher(watcher_id_);
      outbox_->Detach();
    }
    delete this;
  }

 private:
  Broker* const broker_;
  uint64_t watcher_id_ = 0;
  std::shared_ptr<WatchOutbox> outbox_;
};

bool WatchOutbox::Push(const v1::WatchEvent& event) {
  absl::MutexLock lock(&mu_);
  if (finished_ || closing_) return false;
  if (queue_.size() >= kMaxQueuedWatchEvents) {
    reset_owed_ = true;
    return false;
  }
  queue_.push_back(event);
  Pump();
  return true;
}

void WatchOutbox::Close() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  Pump();
}

void WatchOutbox::Cancel() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  queue_.clear();
  final_status_ = grpc::Status::CANCELLED;
  Pump();
}

void WatchOutbox::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  if (!ok) {
    closing_ = true;
    queue_.clear();
  }
  if (reset_owed_ && queue_.size() < kMaxQueuedWatchEvents / 2 && !closing_) {
    reset_owed_ = false;
    v1::WatchEvent reset;
    reset.set_kind(v1::WatchEvent::KIND_RESET);
    queue_.push_back(std::move(reset));
  }
  Pump();
}

void WatchOutbox::Pump() {
  WatchStream* stream = stream_;
  if (stream == nullptr || finished_ || writing_) return;
  if (!queue_.empty()) {
    in_flight_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    const v1::WatchEvent* event = &in_flight_;
    mu_.Unlock();
    stream->StartWrite(event);
    mu_.Lock();
  } else if (closing_) {
    finished_ = true;
    grpc::Status status = final_status_;
    mu_.Unlock();
    stream->Finish(status);
    mu_.Lock();
  }
}

}  // namespace

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* BrokerService::Session(
    grpc::CallbackServerContext* context) {
  return new SessionStream(broker_, context);
}

grpc::ServerUnaryReactor* BrokerService::Allocate(grpc::CallbackServerContext* context,
                                                  const v1::AllocateRequest* request,
                                                  v1::AllocateResponse* response) {
  absl::StatusOr<uint64_t> session = Authenticate(broker_, context);
  if (!session.ok()) return FinishNow(context, session.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  broker_->Allocate(*session, *request,
                    [reactor, response](absl::StatusOr<v1::AllocateResponse> result) {
                      if (result.ok()) *response = std::move(*result);
                      reactor->Finish(ToGrpcStatus(result.status()));
                    });
  return reactor;
}

grpc::ServerUnaryReactor* BrokerService::Export(grpc::CallbackServerContext* context,
                                                const v1::ExportRequest* request,
                                                v1::AllocateResponse* response) {
  absl::StatusOr<uint64_t> session = Authenticate(broker_, context);
  if (!session.ok()) return FinishNow(context, session.status());
  return FinishWith(context, broker_->Export(*session, *request), response);
}

grpc::ServerUnaryReactor* BrokerService::Publish(grpc::CallbackServerContext* context,
                                                 const v1::PublishRequest* request,
                                                 v1::PublishResponse* response) {
  absl::StatusOr<uint64_t> session = Authenticate(broker_, context);
  if (!session.ok()) return FinishNow(context, session.status());
  return FinishWith(context, broker_->Publish(*session, *request), response);
}

grpc::ServerUnaryReactor* BrokerService::Acquire(grpc::CallbackServerContext* context,
                                                 const v1::AcquireRequest* request,
                                                 v1::AcquireResponse* response) {
  absl::StatusOr<uint64_t> session = Authenticate(broker_, context);
  if (!session.ok()) return FinishNow(context, session.status());
  auto* reactor = new WaitReactor(broker_, response);
  reactor->Begin([&](auto done) { return broker_->Acquire(*session, *request, std::move(done)); });
  return reactor;
}

grpc::ServerUnaryReactor* BrokerService::Take(grpc::CallbackServerContext* context,
                                              const v1::TakeRequest* request,
                                              v1::AcquireResponse* response) {
  absl::StatusOr<uint64_t> session = Authenticate(broker_, context);
  if (!session.ok()) return FinishNow(context, session.status());
  auto* reactor = new WaitReactor(broker_, response);
  reactor->Begin([&](auto done) { return broker_->Take(*session, *request, std::move(done)); });
  return reactor;
}

grpc::ServerUnaryReactor* BrokerService::Release(grpc::CallbackServerContext* context,
                                                 const v1::ReleaseRequest* request,
                                                 v1::ReleaseResponse* response) {
  absl::StatusOr<uint64_t> session = Authenticate(broker_, context);
  if (!session.ok()) return FinishNow(context, session.status());
  *response = broker_->Release(*session, *request);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* BrokerService::Delete(grpc::CallbackServerContext* context,
                                                const v1::DeleteRequest* request,
                                                v1::DeleteResponse* response) {
  absl::StatusOr<uint64_t> session = Authenticate(broker_, context);
  if (!session.ok()) return FinishNow(context, session.status());
  return FinishWith(context, broker_->Delete(*session, *request), response);
}

grpc::ServerUnaryReactor* BrokerService::List(grpc::CallbackServerContext* context,
                                              const v1::ListRequest* request,
                                              v1::ListResponse* response) {
  absl::StatusOr<uint64_t> session = Authenticate(broker_, context);
  if (!session.ok()) return FinishNow(context, session.status());
  return FinishWith(context, broker_->List(*session, *request), response);
}

grpc::ServerUnaryReactor* BrokerService::Stat(grpc::CallbackServerContext* context,
                                              const v1::StatRequest* request,
                                              v1::StatResponse* response) {
  absl::StatusOr<uint64_t> session = Authenticate(broker_, context);
  if (!session.ok()) return FinishNow(context, session.status());
  return FinishWith(context, broker_->Stat(*session, *request), response);
}

grpc::ServerUnaryReactor* BrokerService::Status(grpc::CallbackServerContext* context,
                                                const v1::StatusRequest* request,
                                                v1::StatusResponse* response) {
  absl::StatusOr<uint64_t> session = Authenticate(broker_, context);
  if (!session.ok()) return FinishNow(context, session.status());
  *response = broker_->GetStatus();
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::WatchEvent>* BrokerService::Watch(grpc::CallbackServerContext* context,
                                                               const v1::WatchRequest* request) {
  return new WatchStream(broker_, context, *request);
}

}  // namespace tensord::server
