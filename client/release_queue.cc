#include "client/release_queue.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>

#include "client/lease_view.h"
#include "common/check.h"
#include "common/status.h"

namespace tensord::internal {

absl::StatusOr<std::shared_ptr<ReleaseQueue>> ReleaseQueue::Create() {
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return common::ErrnoToStatus("eventfd for the release queue", errno);
  return std::shared_ptr<ReleaseQueue>(new ReleaseQueue(common::UniqueFd(fd)));
}

ReleaseQueue::~ReleaseQueue() {
  // Every queued view holds a reference to this queue, so none can be left here.
  TENSORD_CHECK(head_.load() == nullptr);
}

void ReleaseQueue::Push(LeaseView* view) noexcept {
  view->MarkQueued();
  view->queue_->PushView(view);
}

void ReleaseQueue::PushView(LeaseView* view) noexcept {
  if (stopped()) {
    // The view may hold the last reference to this queue: keep it alive until we return.
    std::shared_ptr<ReleaseQueue> keep = view->queue_;
    if (view->SettleQueued()) delete view;
    return;
  }
  LeaseView* old = head_.load(std::memory_order_relaxed);
  do {
    view->next_in_queue = old;
  } while (!head_.compare_exchange_weak(old, view, std::memory_order_seq_cst,
                                        std::memory_order_relaxed));
  const int64_t depth = size_.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (old == nullptr || depth == wake_at_.load(std::memory_order_acquire)) Wake();
  // Stop() may have drained the stack between our check and our push: whoever sees the
  // flag after pushing drains again, so no view is stranded (each is popped exactly once).
  if (stopped()) DrainInline();
}

void ReleaseQueue::PushLeaseIds(const std::vector<uint64_t>& lease_ids) {
  if (lease_ids.empty() || stopped()) return;
  bool was_empty;
  {
    absl::MutexLock lock(&ids_mu_);
    was_empty = lease_ids_.empty();
    lease_ids_.insert(lease_ids_.end(), lease_ids.begin(), lease_ids.end());
  }
  if (was_empty) Wake();
}

std::vector<LeaseView*> ReleaseQueue::PopAll() {
  LeaseView* top = head_.exchange(nullptr, std::memory_order_seq_cst);
  std::vector<LeaseView*> views;
  for (LeaseView* v = top; v != nullptr; v = v->next_in_queue) views.push_back(v);
  size_.fetch_sub(static_cast<int64_t>(views.size()), std::memory_order_acq_rel);
  std::reverse(views.begin(), views.end());
  for (LeaseView* v : views) v->next_in_queue = nullptr;
  return views;
}

std::vector<uint64_t> ReleaseQueue::PopLeaseIds() {
  absl::MutexLock lock(&ids_mu_);
  return std::exchange(lease_ids_, {});
}

void ReleaseQueue::Wake() noexcept {
  wakes_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t one = 1;
  // Non-blocking: EAGAIN means the counter is already saturated, i.e. already signalled.
  ssize_t ignored = ::write(event_fd_.get(), &one, sizeof(one));
  (void)ignored;
}

bool ReleaseQueue::ConsumeWake() noexcept {
  uint64_t value = 0;
  return ::read(event_fd_.get(), &value, sizeof(value)) == sizeof(value);
}

void ReleaseQueue::DrainInline() noexcept {
  LeaseView* top = head_.exchange(nullptr, std::memory_order_seq_cst);
  if (top == nullptr) return;
  std::shared_ptr<ReleaseQueue> keep = top->queue_;
  while (top != nullptr) {
    size_.fetch_sub(1, std::memory_order_acq_rel);
    LeaseView* next = top->next_in_queue;
    top->next_in_queue = nullptr;
    // A view revived after it was queued is freed by its own last Unref (inline, since the
    // queue is stopped).
    if (top->SettleQueued()) delete top;
    top = next;
  }
}

void ReleaseQueue::Stop() noexcept {
  stopped_.store(true, std::memory_order_seq_cst);
  DrainInline();
}

void ReleaseQueue::AbandonInForkedChild() noexcept {
  stopped_.store(true, std::memory_order_seq_cst);
  int fd = event_fd_.release();
  if (fd >= 0) ::close(fd);
  DrainInline();
}

// --- ReleaseSender ---

ReleaseSender::ReleaseSender(std::shared_ptr<ReleaseQueue> queue, ReleaseSink* sink,
                             Options options)
    : queue_(std::move(queue)), sink_(sink), options_(std::move(options)) {
  TENSORD_CHECK(queue_ != nullptr && sink_ != nullptr && options_.max_batch > 0);
  thread_ = std::thread([this] { Run(); });
}

ReleaseSender::~ReleaseSender() { Stop(); }

void ReleaseSender::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_.store(true, std::memory_order_seq_cst);
  queue_->Wake();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  queue_->Stop();
}

void ReleaseSender::AbandonInForkedChild() noexcept {
  // The thread does not exist in the child; destroying a joinable std::thread would
  // terminate, so the handle is leaked on purpose.
  new std::thread(std::move(thread_));
  queue_->AbandonInForkedChild();
}

bool ReleaseSender::Flush(std::chrono::milliseconds timeout) {
  const uint64_t ticket = flush_requested_.fetch_add(1, std::memory_order_acq_rel) + 1;
  queue_->Wake();
  absl::MutexLock lock(&mu_);
  auto done = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || flush_done_ >= ticket;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&done), absl::FromChrono(timeout));
}

bool ReleaseSender::WaitFor(ReleaseSink::Clock::time_point deadline) {
  pollfd fds[2] = {{queue_->event_fd(), POLLIN, 0}, {options_.hangup_fd, 0, 0}};
  nfds_t n = (options_.hangup_fd >= 0 && !hangup_reported_) ? 2 : 1;
  timespec ts{};
  timespec* timeout = nullptr;
  if (deadline != ReleaseSink::Clock::time_point::max()) {
    auto left = deadline - ReleaseSink::Clock::now();
    if (left < std::chrono::nanoseconds(0)) left = std::chrono::nanoseconds(0);
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    ts.tv_sec = static_cast<time_t>(ns / 1000000000);
    ts.tv_nsec = static_cast<long>(ns % 1000000000);
    timeout = &ts;
  }
  int rc = ::ppoll(fds, n, timeout, nullptr);
  if (rc <= 0) return false;  // timeout, or EINTR: the caller loops
  if (n == 2 && (fds[1].revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) {
    hangup_reported_ = true;
    if (options_.on_hangup) options_.on_hangup();
  }
  return true;
}

void ReleaseSender::Run() {
  using Clock = ReleaseSink::Clock;
  uint64_t done = 0;
  // Views popped but not sent yet (fewer than a batch), and when the window of the oldest
  // of them closes.
  std::vector<LeaseView*> views;
  std::vector<uint64_t> ids;
  Clock::time_point collect_until{};
  while (!stopping_.load(std::memory_order_acquire)) {
    queue_->ConsumeWake();
    uint64_t ticket = flush_requested_.load(std::memory_order_acquire);
    TakeLeaseIds(ids);
    if (views.empty() && queue_->empty() && ids.empty() && ticket == done) {
      // Stop() sets the flag before its wake: if ConsumeWake() above ate that wake, the
      // flag is visible here, and ppoll must not wait for a wake that already came.
      if (stopping_.load(std::memory_order_seq_cst)) break;
      WaitFor(sink_->Tick(Clock::now()));
      continue;
    }
    // Each entry goes out within max_delay of the first one waiting, or at once when a
    // batch is full, a flush is asked for, or we are stopping.
    if (views.empty()) collect_until = Clock::now() + options_.max_delay;
    ticket = Collect(views.size(), done, ticket, collect_until);
    std::vector<LeaseView*> popped = queue_->PopAll();
    views.insert(views.end(), popped.begin(), popped.end());
    TakeLeaseIds(ids);
    // Full batches go now; a partial one only once its window closed (or a flush or stop
    // asks): otherwise it keeps collecting with the deadline of its oldest entry.
    const bool send_all = ticket != done || stopping_.load(std::memory_order_acquire) ||
                          Clock::now() >= collect_until;
    const size_t send = send_all ? views.size()
                                 : views.size() / options_.max_batch * options_.max_batch;
    SendBatches(views, send, ids);
    if (send_all) {
      done = ticket;
      absl::MutexLock lock(&mu_);
      flush_done_ = done;
    }
    sink_->Tick(Clock::now());
  }
  // Stopping: what was collected still goes (the queue's own Stop() drains the rest).
  SendCollected(views);
}

void ReleaseSender::TakeLeaseIds(std::vector<uint64_t>& ids) {
  std::vector<uint64_t> new_ids = queue_->PopLeaseIds();
  ids.insert(ids.end(), new_ids.begin(), new_ids.end());
}

uint64_t ReleaseSender::Collect(size_t pending, uint64_t done, uint64_t ticket,
                                ReleaseSink::Clock::time_point until) {
  // While collecting, the views stay on the stack: later pushes find it non-empty and do
  // not wake this thread, except the one that fills the batch.
  auto full = [&] { return pending + queue_->size() >= options_.max_batch; };
  queue_->set_wake_at(options_.max_batch - pending);
  while (!full() && ticket == done && !stopping_.load(std::memory_order_acquire) &&
         ReleaseSink::Clock::now() < until) {
    WaitFor(until);
    queue_->ConsumeWake();
    ticket = flush_requested_.load(std::memory_order_acquire);
  }
  return ticket;
}

void ReleaseSender::SendBatches(std::vector<LeaseView*>& views, size_t send, std::vector<uint64_t>& ids) {
  size_t i = 0;
  do {
    size_t n = std::min(options_.max_batch, send - i);
    std::vector<LeaseView*> chunk(views.begin() + static_cast<ptrdiff_t>(i),
                                  views.begin() + static_cast<ptrdiff_t>(i + n));
    sink_->ProcessBatch(std::move(chunk), std::exchange(ids, {}));
    i += n;
  } while (i < send);
  views.erase(views.begin(), views.begin() + static_cast<ptrdiff_t>(send));
}

void ReleaseSender::SendCollected(const std::vector<LeaseView*>& views) {
  for (size_t i = 0; i < views.size(); i += options_.max_batch) {
    size_t n = std::min(options_.max_batch, views.size() - i);
    sink_->ProcessBatch(std::vector<LeaseView*>(views.begin() + static_cast<ptrdiff_t>(i),
                                                views.begin() + static_cast<ptrdiff_t>(i + n)),
                        {});
  }
}

}  // namespace tensord::internal
