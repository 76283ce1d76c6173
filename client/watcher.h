// WatcherImpl: a Broker.Watch server stream read by a background thread into a bounded
// queue (kMaxQueued events; when full the reader stops reading, so gRPC flow control
// pushes back on the broker, which sends a RESET if it has to drop events).
//
// Next(timeout) pops one event or returns nullopt when the timeout passes first;
// UNAVAILABLE (with the stream's status) once the stream ended and the queue is drained;
// CANCELLED after Cancel(). Cancel() ends the call (ClientContext::TryCancel) and wakes
// Next(). The destructor cancels and joins the reader. Holds the Session (its stub and
// token) alive. Thread-safe.
//
// fork(): the call is made with cancel_on_fork, so the Session's fork preparation cancels
// it; the reader destroys the call, waits for the fork to finish, reopens from where it was
// (initial=false) and queues a RESET, since changes during the gap were not seen. In the
// child the watcher belongs to the parent: Next() answers UNAVAILABLE.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/session.h"
#include "tensord/client.h"

namespace tensord::internal {

// The public form of one event, validated.
absl::StatusOr<WatchEvent> ToPublicEvent(const tensord::v1::WatchEvent& event);

class WatcherImpl final : public Watcher {
 public:
  static constexpr size_t kMaxQueued = 1024;

  static absl::StatusOr<std::unique_ptr<Watcher>> Start(std::shared_ptr<Session> session,
                                                        std::string_view prefix, bool initial);
  ~WatcherImpl() override;

  Result<std::optional<WatchEvent>> Next(std::chrono::milliseconds timeout) override;
  void Cancel() override;

 private:
  WatcherImpl(std::shared_ptr<Session> session, std::string prefix)
      : session_(std::move(session)), prefix_(std::move(prefix)) {}
  using Reader = grpc::ClientReader<tensord::v1::WatchEvent>;
  // Starts the Watch call and waits until the broker has registered it (its initial
  // metadata), so no change made after this returns is missed.
  std::unique_ptr<Reader> Open(const Session::RpcCall& call, bool initial);
  // The reader thread: reads the first call, and reopens it after each fork.
  void Run(Session::RpcCall first_call, std::unique_ptr<Reader> first_reader);
  // Reads one call until it ends; returns its final status.
  grpc::Status ReadCall(const Session::RpcCall& call, std::unique_ptr<Reader> reader, bool reopened);

  const std::shared_ptr<Session> session_;
  const std::string prefix_;
  std::thread thread_;

  absl::Mutex mu_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // the open call's
  std::deque<absl::StatusOr<WatchEvent>> queue_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  Status end_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::internal
