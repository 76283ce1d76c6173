// SessionStream: one Broker.Session bidirectional stream (sync API) attached to a session
// by its token. Acquire, Take, Publish and Release ride it.
//
// Call() sends a request with a fresh seq and waits for the response with that seq, up to
// an optional deadline (the broker enforces an acquire's own wait; the caller adds slack).
// CallMany() sends a batch as one message: every request gets a fresh seq and they travel
// together in a SessionRequest.batch (several, for a batch over 4096 requests or 1 MiB), and
// the broker sends the replies that are ready together in one SessionResponse.batch. It
// waits for every reply up to one deadline and returns one result per request, in order. A request not answered by the deadline gets
// DEADLINE_EXCEEDED (its late reply goes to the orphan handler); if the stream breaks, every
// outstanding request gets UNAVAILABLE, as in Call().
// Send() writes a request with seq 0 (a release that wants no reply). SendQuiet() writes a
// quiet publish: it gets a seq, but the broker answers it only if it fails. Seqs are handed
// out under the write lock, so seq order is write order, which is the order the broker
// handles requests and queues their immediate answers: any reply to a later seq means a
// quiet request before it went through. A quiet request's failure, and every quiet request
// still unconfirmed when the stream ends (unless a drain ended it cleanly, which proves the
// broker handled them), goes to the quiet-failure handler. Writes are serialized by a mutex. A reader thread matches responses to waiting callers and hands pushes
// (seq 0: `retired`, `cache_reset`) to the push handler, and replies nobody waits for any
// more (their caller timed out) to the orphan handler, so a lease they carry is released.
// Both handlers run on the reader thread and must not block on this stream.
//
// When the stream breaks, every pending caller gets UNAVAILABLE and broken() turns true; the
// owner opens a new stream for the next call (the session itself lives on the fd channel).
// Close() cancels the call and joins the reader. Drain() ends it without losing a reply:
// it half-closes, the broker cancels the waits still pending and finishes once every reply
// is written, and the reader hands each reply to its caller. A caller whose call the drain
// interrupted (its wait was cancelled, or its write came too late) sees
// IsInterruptedByDrain() and may retry on the next stream. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"
#include "tensord/v1/broker.grpc.pb.h"

namespace tensord::internal {

class SessionStream {
 public:
  using Handler = std::function<void(const tensord::v1::SessionResponse&)>;
  // A quiet request failed or was lost; the status names it by its label.
  using QuietFailureHandler = std::function<void(absl::Status)>;
  using Clock = std::chrono::steady_clock;

  static absl::StatusOr<std::unique_ptr<SessionStream>> Open(tensord::v1::Broker::Stub* stub,
                                                             const std::string& session_token,
                                                             Handler on_push, Handler on_orphan,
                                                             QuietFailureHandler on_quiet_failure = {});
  ~SessionStream();  // Close()
  SessionStream(const SessionStream&) = delete;
  SessionStream& operator=(const SessionStream&) = delete;

  // `deadline` nullopt: wait as long as the stream lives.
  absl::StatusOr<tensord::v1::SessionResponse> Call(tensord::v1::SessionRequest request,
                                                    std::optional<Clock::time_point> deadline);
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> CallMany(
      std::vector<tensord::v1::SessionRequest> requests, std::optional<Clock::time_point> deadline);
  absl::Status Send(tensord::v1::SessionRequest request);
  // `label` names the request in a failure ("publish 'a/b'"). An error here means it was not
  // written.
  absl::Status SendQuiet(tensord::v1::SessionRequest request, std::string label);
  // Quiet requests written and not yet confirmed.
  size_t quiet_in_flight();

  bool broken() const { return broken_.load(std::memory_order_acquire); }
  void Close();
  // Half-closes and reads until the broker finishes the stream, then joins the reader;
  // past `deadline`, cancels instead (replies still in flight are then lost: their leases
  // stay with the session until it ends).
  void Drain(Clock::time_point deadline);
  // Whether `result` (from Call on this stream) failed only because Drain() ran.
  bool IsInterruptedByDrain(const absl::StatusOr<tensord::v1::SessionResponse>& result) const;
  // In a fork child: the reader thread and gRPC's state belong to the parent; leak them.
  void AbandonInForkedChild() noexcept;

 private:
  struct Waiter {
    bool done = false;
    absl::StatusOr<tensord::v1::SessionResponse> result;
    size_t* outstanding = nullptr;  // the batch's count of waiters not done, under mu_
  };
  // Marks `waiter` done with `result`.
  static void Complete(Waiter* waiter, absl::StatusOr<tensord::v1::SessionResponse> result);
  struct QuietRequest {
    uint64_t seq;
    std::string label;
  };
  SessionStream(Handler on_push, Handler on_orphan, QuietFailureHandler on_quiet_failure)
      : on_push_(std::move(on_push)),
        on_orphan_(std::move(on_orphan)),
        on_quiet_failure_(std::move(on_quiet_failure)) {}
  void ReadLoop();
  absl::Status Write(const tensord::v1::SessionRequest& request);
  // Under one hold of the write lock: gives `requests` their seqs and registers `waiters`
  // (parallel to them), then writes them in order. Returns how many were written and, when
  // fewer than all, why the next one was not.
  size_t WriteAll(std::vector<tensord::v1::SessionRequest>& requests, std::vector<Waiter>& waiters,
                  std::vector<uint64_t>& seqs, size_t* outstanding, absl::Status* error);
  // Hands each reply to its waiter, or to on_orphan_ when nobody waits for it.
  void Deliver(std::span<tensord::v1::SessionResponse* const> replies);
  absl::Status ClosedStatus() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Handler on_push_;
  const Handler on_orphan_;
  const QuietFailureHandler on_quiet_failure_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<tensord::v1::SessionRequest, tensord::v1::SessionResponse>>
      stream_;
  std::thread reader_;
  std::atomic<bool> broken_{false};
  std::atomic<bool> closed_{false};
  std::atomic<bool> draining_{false};

  // Held while seqs are handed out and written; taken before mu_ when both are held.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Waiter*> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<QuietRequest> quiet_ ABSL_GUARDED_BY(mu_);  // in seq order
  std::string end_message_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::internal
