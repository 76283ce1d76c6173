// The release path from DLPack deleters to the broker.
//
// ReleaseQueue is the state a deleter touches: a lock-free intrusive stack of LeaseViews
// whose last reference went (Treiber push; the sender pops everything at once with an
// atomic exchange, so there is no ABA), an eventfd that wakes the sender when a push finds
// the stack empty or fills the sender's batch (a non-blocking write), and a `stopped` flag. It is owned by shared_ptr:
// every LeaseView holds one, so it outlives the Client. Once stopped (Client destroyed,
// process exit, or a fork child abandoning its parent's session), a push frees the view
// inline instead (munmap, no RPC: closing the session released the lease). Push() never
// blocks and never throws. Lease ids to release that have no view (a duplicate lease, a
// reply that came after its caller gave up) go through PushLeaseIds(), from ordinary
// threads only (it takes a mutex).
//
// ReleaseSender owns the thread that drains the queue: after a wake-up it collects for up
// to `max_delay` (1 ms) or until `max_batch` (256) views, whichever is first, and hands the
// batch to its ReleaseSink. It leaves the views on the stack while it collects, so the
// pushes of a window after the first find it non-empty and wake nobody (one wake-up per
// batch, not per release); the push that fills the batch wakes it early. The sink decides
// per view between the lease cache and a release, and sends one ReleaseRequest for the
// batch. Flush() makes it send at once and returns when
// that send is done. Between batches it calls the sink's Tick() (lease-cache linger), and
// it reports a hang-up of an optional watched fd (the fd channel: the broker went away).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"

namespace tensord::internal {

class LeaseView;

class ReleaseQueue {
 public:
  static absl::StatusOr<std::shared_ptr<ReleaseQueue>> Create();
  ~ReleaseQueue();
  ReleaseQueue(const ReleaseQueue&) = delete;
  ReleaseQueue& operator=(const ReleaseQueue&) = delete;

  // Queues `view` (its refcount just reached zero) on its own queue. Never blocks.
  static void Push(LeaseView* view) noexcept;
  // Queues lease ids with no view. Takes a mutex: not for deleters.
  void PushLeaseIds(const std::vector<uint64_t>& lease_ids);

  // Everything queued, oldest first. For the sender (and Stop).
  std::vector<LeaseView*> PopAll();
  std::vector<uint64_t> PopLeaseIds();
  bool empty() const { return head_.load(std::memory_order_acquire) == nullptr; }
  // Views on the stack (it may lag a concurrent push or pop by one).
  size_t size() const {
    const int64_t n = size_.load(std::memory_order_acquire);
    return n > 0 ? static_cast<size_t>(n) : 0;
  }
  // A push that makes the stack this deep wakes the sender (as does one onto an empty one).
  void set_wake_at(size_t depth) { wake_at_.store(static_cast<int64_t>(depth), std::memory_order_release); }

  int event_fd() const { return event_fd_.get(); }
  void Wake() noexcept;
  // Drains the eventfd counter; true when it was signalled.
  bool ConsumeWake() noexcept;

  // From here on pushes free views inline; frees what is queued now. Idempotent.
  void Stop() noexcept;
  bool stopped() const noexcept { return stopped_.load(std::memory_order_seq_cst); }
  // In a fork child: stop without touching anything another (vanished) thread may hold
  // and close the inherited eventfd.
  void AbandonInForkedChild() noexcept;

  uint64_t wakes_for_test() const { return wakes_.load(); }

 private:
  explicit ReleaseQueue(common::UniqueFd event_fd) : event_fd_(std::move(event_fd)) {}
  void PushView(LeaseView* view) noexcept;
  // Frees every queued view inline (stopped queues only).
  void DrainInline() noexcept;

  std::atomic<LeaseView*> head_{nullptr};
  // Signed: a pop that takes a view whose push has not counted it yet dips below zero.
  std::atomic<int64_t> size_{0};
  std::atomic<int64_t> wake_at_{0};  // 0: only pushes onto an empty stack wake
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> wakes_{0};
  common::UniqueFd event_fd_;
  absl::Mutex ids_mu_;
  std::vector<uint64_t> lease_ids_ ABSL_GUARDED_BY(ids_mu_);
};

class ReleaseSink {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~ReleaseSink() = default;
  // `views` reached zero references (oldest first); `lease_ids` are bare ids to release.
  // Takes ownership of the views (caches or destroys each).
  virtual void ProcessBatch(std::vector<LeaseView*> views, std::vector<uint64_t> lease_ids) = 0;
  // Housekeeping between batches; returns when it next wants to run (max(): never).
  virtual Clock::time_point Tick(Clock::time_point now) = 0;
};

class ReleaseSender {
 public:
  struct Options {
    size_t max_batch = 256;
    std::chrono::microseconds max_delay{1000};
    int hangup_fd = -1;                // polled for POLLHUP/POLLERR only
    std::function<void()> on_hangup;   // called once, on the sender thread
  };
  // Starts the thread. `sink` must outlive Stop().
  ReleaseSender(std::shared_ptr<ReleaseQueue> queue, ReleaseSink* sink, Options options);
  // Stops (see Stop()).
  ~ReleaseSender();
  ReleaseSender(const ReleaseSender&) = delete;
  ReleaseSender& operator=(const ReleaseSender&) = delete;

  // Sends what is queued now; returns once the sink has processed it, or after `timeout`
  // (false). A stopped sender returns true at once.
  bool Flush(std::chrono::milliseconds timeout);
  // Joins the thread, then stops the queue (later pushes free inline). Idempotent.
  void Stop();
  // In a fork child: the thread does not exist there; forget it without joining.
  void AbandonInForkedChild() noexcept;

 private:
  void Run();
  // Waits for a wake-up, the watched fd, or `deadline`; true when woken or hung up.
  bool WaitFor(ReleaseSink::Clock::time_point deadline);
  // Run's steps. Appends the queued lease ids to `ids`.
  void TakeLeaseIds(std::vector<uint64_t>& ids);
  // Collects with the views left on the stack until `pending` views and the stack fill a
  // batch, a flush after `done` is asked for, the sender stops, or `until` passes; returns
  // the latest flush ticket (`ticket`, or a later one).
  uint64_t Collect(size_t pending, uint64_t done, uint64_t ticket, ReleaseSink::Clock::time_point until);
  // Hands the first `send` views to the sink in batches of up to max_batch (one, empty,
  // when `send` is 0), `ids` with the first; erases them from `views`.
  void SendBatches(std::vector<LeaseView*>& views, size_t send, std::vector<uint64_t>& ids);
  // Stopping: hands what was collected to the sink in batches of up to max_batch.
  void SendCollected(const std::vector<LeaseView*>& views);

  const std::shared_ptr<ReleaseQueue> queue_;
  ReleaseSink* const sink_;
  const Options options_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> flush_requested_{0};
  bool hangup_reported_ = false;  // sender thread only
  absl::Mutex mu_;
  uint64_t flush_done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tensord::internal
