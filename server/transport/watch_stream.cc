#include "server/transport/watch_stream.h"

#include <deque>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "server/transport/grpc_status.h"
#include "server/transport/wire_messages.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

constexpr size_t kMaxQueuedWatchEvents = 4096;
// The broker reads the next page of a watcher's initial bindings (a few hundred events at
// most: Broker::SendInitialBindings) once fewer than this many events wait here, so they
// never crowd out the changes that come meanwhile.
constexpr size_t kInitialRefillBelow = 1024;

class WatchStream;

class WatchOutbox final : public WatchSink {
 public:
  explicit WatchOutbox(WatchStream* stream) : stream_(stream) {}
  bool Push(const v1::WatchEvent& event) override;
  void Close() override;
  void OnWriteDone(bool ok);
  void Cancel();
  // The watcher asked for its initial bindings (WatchRequest.initial): the broker sends them
  // a page at a time, each asked for when this queue runs low.
  void ExpectInitial();
  // The broker sent a page of initial bindings; `more`: some are left. Returns whether the
  // caller should have the next page sent now (the queue is still low).
  bool InitialPageSent(bool more);
  void Detach() {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
  }

 private:
  // What Pump() decided, for its caller to do once mu_ is released (as the Broker's
  // Effects): start the next write, or finish the call.
  struct Effects {
    WatchStream* stream = nullptr;  // null: nothing to do
    const grpc::ByteBuffer* write = nullptr;  // in_flight_bytes_, while writing_ is set
    bool send_initial = false;  // have the broker send the next page of initial bindings
    bool finish = false;
    grpc::Status status;  // with `finish`
  };
  // Decides the next write or the finish; the caller delivers them after unlocking.
  [[nodiscard]] Effects Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the next page of initial bindings should be asked for now; marks it asked for.
  bool TakeInitialTurnLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs what Pump() decided, without mu_. The stream cannot finish while a write is in
  // flight (writing_ set) or before the finish it is told, so it outlives these calls.
  static void Deliver(const Effects& effects);

  absl::Mutex mu_;
  WatchStream* stream_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::WatchEvent> queue_ ABSL_GUARDED_BY(mu_);
  v1::WatchEvent in_flight_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer in_flight_bytes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reset_owed_ ABSL_GUARDED_BY(mu_) = false;
  bool initial_pending_ ABSL_GUARDED_BY(mu_) = false;  // initial bindings left to send
  // A page of initial bindings is being sent: the call does not finish under it.
  bool initial_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

class WatchStream final : public SingleRequestCall {
 public:
  WatchStream(Broker* broker, absl::StatusOr<uint64_t> session) : broker_(broker), session_(std::move(session)) {}

  void OnRequest(const grpc::ByteBuffer& bytes) override {
    v1::WatchRequest request;
    if (absl::Status parsed = ParseRequest(bytes, &request); !parsed.ok()) return Finish(ToGrpcStatus(parsed));
    if (!session_.ok()) return Finish(ToGrpcStatus(session_.status()));
    outbox_ = std::make_shared<WatchOutbox>(this);
    absl::StatusOr<uint64_t> id = broker_->AddWatcher(*session_, request, outbox_);
    if (!id.ok()) {
      outbox_->Detach();
      outbox_.reset();
      return Finish(ToGrpcStatus(id.status()));
    }
    watcher_id_ = *id;
    // Registered: a client waiting for this before it returns from Watch() sees every
    // change made after that.
    StartSendInitialMetadata();
    if (request.initial()) outbox_->ExpectInitial();
  }
  // Has the broker send pages of initial bindings while the outbox wants them.
  void SendInitialPages() {
    while (outbox_->InitialPageSent(broker_->SendInitialBindings(watcher_id_))) {
    }
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
  }

 private:
  Broker* const broker_;
  const absl::StatusOr<uint64_t> session_;
  uint64_t watcher_id_ = 0;
  std::shared_ptr<WatchOutbox> outbox_;
};

bool WatchOutbox::Push(const v1::WatchEvent& event) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (finished_ || closing_) return false;
    if (queue_.size() >= kMaxQueuedWatchEvents) {
      reset_owed_ = true;
      return false;
    }
    queue_.push_back(event);
    effects = Pump();
  }
  Deliver(effects);
  return true;
}

void WatchOutbox::Close() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    effects = Pump();
  }
  Deliver(effects);
}

void WatchOutbox::ExpectInitial() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    initial_pending_ = true;
    effects.send_initial = TakeInitialTurnLocked();
    if (effects.send_initial) effects.stream = stream_;
  }
  Deliver(effects);
}

bool WatchOutbox::InitialPageSent(bool more) {
  Effects effects;
  bool again = false;
  {
    absl::MutexLock lock(&mu_);
    initial_in_flight_ = false;
    initial_pending_ = more;
    again = TakeInitialTurnLocked();
    effects = Pump();
  }
  Deliver(effects);
  return again;
}

bool WatchOutbox::TakeInitialTurnLocked() {
  if (!initial_pending_ || initial_in_flight_ || closing_ || finished_ || stream_ == nullptr ||
      queue_.size() >= kInitialRefillBelow) {
    return false;
  }
  initial_in_flight_ = true;
  return true;
}

void WatchOutbox::Cancel() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    queue_.clear();
    final_status_ = grpc::Status::CANCELLED;
    effects = Pump();
  }
  Deliver(effects);
}

void WatchOutbox::OnWriteDone(bool ok) {
  Effects effects;
  {
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
    effects = Pump();
    effects.send_initial = TakeInitialTurnLocked();
    if (effects.send_initial) effects.stream = stream_;
  }
  Deliver(effects);
}

WatchOutbox::Effects WatchOutbox::Pump() {
  Effects effects;
  if (stream_ == nullptr || finished_ || writing_) return effects;
  while (!queue_.empty()) {
    in_flight_ = std::move(queue_.front());
    queue_.pop_front();
    if (absl::Status serialized = SerializeResponse(in_flight_, &in_flight_bytes_); !serialized.ok()) {
      spdlog::error("watch stream: {}", serialized.ToString());
      continue;
    }
    writing_ = true;
    effects.stream = stream_;
    effects.write = &in_flight_bytes_;
    return effects;
  }
  if (closing_ && !initial_in_flight_) {
    finished_ = true;
    effects.stream = stream_;
    effects.finish = true;
    effects.status = final_status_;
  }
  return effects;
}

void WatchOutbox::Deliver(const Effects& effects) {
  if (effects.stream == nullptr) return;
  if (effects.write != nullptr) effects.stream->StartWrite(effects.write);
  if (effects.finish) effects.stream->Finish(effects.status);
  // The call cannot finish while the page is asked for (initial_in_flight_).
  if (effects.send_initial) effects.stream->SendInitialPages();
}

}  // namespace

std::unique_ptr<ServerCall> NewWatchStream(Broker* broker, absl::StatusOr<uint64_t> session) {
  return std::make_unique<WatchStream>(broker, std::move(session));
}

}  // namespace tensord::server
