#include "server/runtime/timer_queue.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tensord::server {

TimerQueue::TimerQueue() : thread_([this] { Run(); }) {}

TimerQueue::~TimerQueue() { Shutdown(); }

uint64_t TimerQueue::Schedule(Clock::time_point deadline, absl::AnyInvocable<void() &&> callback) {
  absl::MutexLock lock(&mu_);
  uint64_t id = ++last_id_;
  by_deadline_.emplace(deadline, id);
  entries_.emplace(id, Entry{deadline, std::move(callback)});
  wakeup_.Signal();
  return id;
}

bool TimerQueue::Cancel(uint64_t id) {
  absl::AnyInvocable<void() &&> dropped;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  auto [first, last] = by_deadline_.equal_range(it->second.deadline);
  for (auto pos = first; pos != last; ++pos) {
    if (pos->second == id) {
      by_deadline_.erase(pos);
      break;
    }
  }
  dropped = std::move(it->second.callback);
  entries_.erase(it);
  return true;
}

void TimerQueue::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wakeup_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void TimerQueue::Run() {
  mu_.Lock();
  while (!stopping_) {
    if (by_deadline_.empty()) {
      wakeup_.Wait(&mu_);
      continue;
    }
    auto next = by_deadline_.begin();
    Clock::time_point deadline = next->first;
    if (Clock::now() < deadline) {
      // Wake at the deadline, or earlier when something new is scheduled or we stop.
      wakeup_.WaitWithTimeout(&mu_, absl::FromChrono(deadline - Clock::now()));
      continue;
    }
    uint64_t id = next->second;
    by_deadline_.erase(next);
    auto entry = entries_.find(id);
    absl::AnyInvocable<void() &&> callback = std::move(entry->second.callback);
    entries_.erase(entry);
    mu_.Unlock();
    std::move(callback)();
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace tensord::server
