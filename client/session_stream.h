// SessionStream: one Broker.Session bidirectional stream (gRPC's async API, on a completion
// queue of its own) attached to a session by its token. Acquire, Take, Publish and Release
// ride it.
//
// Call() sends a request with a fresh seq and waits for the response with that seq, up to
// an optional deadline (the broker enforces an acquire's own wait; the caller adds slack).
// CallMany() sends a batch as one message: every request gets a fresh seq and they travel
// together in a SessionRequest.batch (several, for a batch over 4096 requests or 1 MiB), and
// the broker sends the replies that are ready together in one SessionResponse.batch. It
// waits for every reply up to one deadline and returns one result per request, in order. A
// request not answered by the deadline gets DEADLINE_EXCEEDED (its late reply goes to the
// orphan handler); if the stream breaks, every outstanding request gets UNAVAILABLE.
// Start() sends one request as Call() does and returns at once: the caller collects the
// reply later from the PendingCall, or gives it up (destroys it uncollected), and a reply
// given up goes to the orphan handler, so a lease it grants is released.
// CallMany() with a CancelState (cancel_state.h, a CancelToken's) waits as long, but while it
// is registered with the token, cancelling it sends a CancelWaitsRequest for the batch's
// seqs, and the call goes on waiting for the replies, which the broker sends at once
// (CANCELLED, or the grant that raced the cancel). Once the token is cancelled every result
// is CANCELLED and a lease a reply grants goes to the orphan handler. A token with a poll
// makes the waiting thread wake every poll period to run it (under no lock); a broker that
// has not answered kCancelGrace after the cancel was seen there is given up on.
// Send() writes a request with seq 0 (a release that wants no reply). SendQuiet() writes a
// quiet publish: it gets a seq, but the broker answers it only if it fails. Seqs are handed
// out in write order, which is the order the broker handles requests and queues their
// immediate answers: any reply to a later seq means a quiet request before it went
// through. A quiet request's failure, and every quiet request still unconfirmed when the
// stream ends (unless a drain ended it cleanly, which proves the broker handled them), goes
// to the quiet-failure handler.
//
// Who reads: one thread at a time polls the completion queue (the "poller"), and it is
// normally the caller waiting for a reply, so a round trip costs no hand-over between
// threads. A background thread takes the role once no caller has held it for 1 ms, so
// pushes are read while the client is idle, and hands it back after the first reply or
// write completion it sees (callers are active again). While a caller holds the role the
// background thread sleeps until it is given up, so a caller blocked in a long wait costs
// no periodic wake-ups. Whoever polls handles every event: replies go to their waiters,
// pushes (seq 0: `retired`, `cache_reset`) to the push handler, replies nobody waits for any
// more (their caller timed out) to the orphan handler, so a lease they carry is released.
// Handlers run on the polling thread, without the stream's lock, and must not block on this
// stream.
// Writes go out one at a time (gRPC allows one in flight); the others queue in order.
//
// When the stream breaks, every pending caller gets UNAVAILABLE and broken() turns true; the
// owner opens a new stream for the next call (the session itself lives on the fd channel).
// Close() cancels the call and waits until gRPC has returned every operation. Drain() ends
// it without losing a reply: it half-closes, the broker cancels the waits still pending and
// finishes once every reply is written, and each reply reaches its caller. A caller whose
// call the drain interrupted (its wait was cancelled, or its write came too late) sees
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
#include "grpcpp/completion_queue.h"
#include "grpcpp/support/async_stream.h"
#include "tensord/v1/broker.grpc.pb.h"

namespace tensord::internal {

class CancelState;

class SessionStream : public std::enable_shared_from_this<SessionStream> {
  // One request's reply, as the poller hands it over.
  struct Waiter {
    bool done = false;
    absl::StatusOr<tensord::v1::SessionResponse> result;
    size_t* outstanding = nullptr;  // the batch's count of waiters not done, under mu_
  };

 public:
  using Handler = std::function<void(const tensord::v1::SessionResponse&)>;
  // A quiet request failed or was lost; the status names it by its label.
  using QuietFailureHandler = std::function<void(absl::Status)>;
  using Clock = std::chrono::steady_clock;
  // How long a cancelled call waits for the broker's answers to its requests.
  static constexpr std::chrono::seconds kCancelGrace{10};

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
  // `cancel` (may be null) as the header comment says; a stream that is not owned by a
  // shared_ptr cannot send the cancel (the call then waits for its replies as without one).
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> CallMany(
      std::vector<tensord::v1::SessionRequest> requests, std::optional<Clock::time_point> deadline,
      CancelState* cancel = nullptr);
  // A request sent by Start(). Destroying it before Await() gives the reply up: one that came
  // already, and one that comes later, goes to the orphan handler. It keeps its stream
  // alive (a call in flight, for fork()) until it is destroyed.
  class PendingCall {
   public:
    ~PendingCall();
    PendingCall(const PendingCall&) = delete;
    PendingCall& operator=(const PendingCall&) = delete;
    // The reply (as Call() returns it), waiting for it up to `deadline`. Once only.
    absl::StatusOr<tensord::v1::SessionResponse> Await(std::optional<Clock::time_point> deadline);
    const SessionStream& stream() const { return *stream_; }

   private:
    friend class SessionStream;
    explicit PendingCall(std::shared_ptr<SessionStream> stream) : stream_(std::move(stream)) {}
    const std::shared_ptr<SessionStream> stream_;
    uint64_t seq_ = 0;
    Waiter waiter_;
    size_t outstanding_ = 1;  // under the stream's mu_
    bool awaited_ = false;
  };
  static absl::StatusOr<std::unique_ptr<PendingCall>> Start(std::shared_ptr<SessionStream> stream,
                                                            tensord::v1::SessionRequest request);
  absl::Status Send(tensord::v1::SessionRequest request);
  // `label` names the request in a failure ("publish 'a/b'"). An error here means it was not
  // sent.
  absl::Status SendQuiet(tensord::v1::SessionRequest request, std::string label);
  // Quiet requests sent and not yet confirmed.
  size_t quiet_in_flight();

  bool broken() const { return broken_.load(std::memory_order_acquire); }
  void Close();
  // Half-closes and waits until the broker finishes the stream; past `deadline`, cancels
  // instead (replies still in flight are then lost: their leases stay with the session until
  // it ends).
  void Drain(Clock::time_point deadline);
  // Whether `result` (from Call on this stream) failed only because Drain() ran.
  bool IsInterruptedByDrain(const absl::StatusOr<tensord::v1::SessionResponse>& result) const;
  // In a fork child: the background thread and gRPC's state belong to the parent; leak them.
  void AbandonInForkedChild() noexcept;

 private:
  struct QuietRequest {
    uint64_t seq;
    std::string label;
  };
  // What one turn of polling found.
  enum class Polled { kNothing, kReply, kWriteDone, kOther };
  // A completion the poller took off the queue.
  struct Completion {
    bool got = false;  // false: the deadline came first
    void* tag = nullptr;
    bool ok = false;
    bool replied = false;  // a message read gave a waiter its reply
  };

  SessionStream(Handler on_push, Handler on_orphan, QuietFailureHandler on_quiet_failure)
      : on_push_(std::move(on_push)),
        on_orphan_(std::move(on_orphan)),
        on_quiet_failure_(std::move(on_quiet_failure)) {}
  // Marks `waiter` done with `result`.
  static void Complete(Waiter* waiter, absl::StatusOr<tensord::v1::SessionResponse> result);
  // The deadline passed before `waiter` (of `seq`) got its reply: it fails with
  // DEADLINE_EXCEEDED, and a reply that still comes goes to the orphan handler.
  void TimeOutLocked(uint64_t seq, Waiter* waiter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RefuseWrites() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a message behind the writes before it and starts the next write if none is in
  // flight.
  void EnqueueLocked(tensord::v1::SessionRequest message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polling is split at the lock: the poller (polling_ set) waits for a completion without
  // mu_ (NextCompletion), then moves the stream on under it (OnCompletionLocked), which
  // returns the handler calls that must wait until mu_ is released (ReportQuietFailures).
  // The poller waits up to `deadline` for one completion; a message read goes to its
  // waiters and handlers here.
  Completion NextCompletion(gpr_timespec deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // The next read or write, or the finish, after `completion`. Quiet requests the stream's
  // end lost are added to `lost`, for the poller to report once it released mu_.
  Polled OnCompletionLocked(const Completion& completion, std::vector<absl::Status>* lost)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Without mu_, by the poller (handlers run on the polling thread).
  void ReportQuietFailures(std::vector<absl::Status> failures) ABSL_LOCKS_EXCLUDED(mu_);
  // Until `done()` (called under mu_) or `deadline`: polls while the role is free, else
  // waits for the poller. False on the deadline.
  bool WaitUntil(const std::function<bool()>& done, std::optional<Clock::time_point> deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // WaitUntil, waking every poll period of `cancel` to run its poll; once it is cancelled,
  // waits at most kCancelGrace more.
  bool WaitCancellable(const std::function<bool()>& done, std::optional<Clock::time_point> deadline,
                       CancelState& cancel) ABSL_LOCKS_EXCLUDED(mu_);
  // CallMany's steps. Queues `requests` (seqs set, in order) as one message, in batches the
  // broker accepts (kMaxBatchRequests, kMaxBatchBytes); a single request goes as it is.
  void EnqueueBatchLocked(std::vector<tensord::v1::SessionRequest>& requests)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Until `outstanding` is 0 or `deadline` (as WaitCancellable with `cancel`, which may be
  // null, its cancel sending CancelWaits for `seqs` meanwhile); then every waiter not done
  // gets DEADLINE_EXCEEDED, so all are done and out of pending_ when it returns.
  void AwaitReplies(std::span<Waiter> waiters, const std::vector<uint64_t>& seqs, const size_t& outstanding,
                    std::optional<Clock::time_point> deadline, CancelState* cancel) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves each (done) waiter's result to `results`; once `cancel` is cancelled every result
  // is CANCELLED and a grant that raced the cancel goes to the orphan handler.
  void CollectResults(std::span<Waiter> waiters, CancelState* cancel,
                      std::vector<absl::StatusOr<tensord::v1::SessionResponse>>& results)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Asks the broker to drop the waits of these requests (no reply).
  void SendCancel(const std::vector<uint64_t>& seqs) ABSL_LOCKS_EXCLUDED(mu_);
  // While a write is queued and nobody polls: takes the poller role for PollReady (true).
  [[nodiscard]] bool ClaimPollerForQueuedWritesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With the role so claimed: handles what has completed already (write completions, so the
  // queued writes go out), never waits, and gives the role back.
  void PollReady() ABSL_LOCKS_EXCLUDED(mu_);
  // Replies to waiters and the orphan and quiet-failure handlers, pushes to the push
  // handler, in the order of the message. True when a waiter got its reply.
  bool HandleMessage(tensord::v1::SessionResponse& message);
  // Hands each reply to its waiter, or to on_orphan_ when nobody waits for it.
  bool Deliver(std::span<tensord::v1::SessionResponse* const> replies);
  // The finish came back: every pending caller fails. Returns the quiet requests it lost,
  // as failures to report once mu_ is released.
  [[nodiscard]] std::vector<absl::Status> OnFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BackgroundLoop() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ClosedStatus() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Handler on_push_;
  const Handler on_orphan_;
  const QuietFailureHandler on_quiet_failure_;
  std::unique_ptr<grpc::CompletionQueue> cq_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientAsyncReaderWriterInterface<tensord::v1::SessionRequest,
                                                         tensord::v1::SessionResponse>>
      stream_;
  std::thread background_;
  std::atomic<bool> broken_{false};
  std::atomic<bool> closed_{false};
  std::atomic<bool> draining_{false};
  // Written by gRPC before the kRead completion; only the poller touches it.
  tensord::v1::SessionResponse read_message_;
  grpc::Status finish_status_;  // written by gRPC before the kFinish completion

  absl::Mutex mu_;
  bool polling_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // the start completed (well or not)
  Clock::time_point last_caller_poll_ ABSL_GUARDED_BY(mu_);  // when a caller last left the role
  int ops_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // started with gRPC, completion not seen yet
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = true;  // the start counts as one
  bool writes_done_started_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<tensord::v1::SessionRequest> outbox_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Waiter*> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<QuietRequest> quiet_ ABSL_GUARDED_BY(mu_);  // in seq order
  std::string end_message_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::internal
