// TimerQueue: runs callbacks at deadlines on one thread (acquire wait timeouts, binding
// TTLs). Cancel() of a timer that has not fired guarantees it never runs; a callback that
// is already running is not waited for. Callbacks must not block. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace tensord::server {

class TimerQueue {
 public:
  using Clock = std::chrono::steady_clock;
  TimerQueue();
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Returns the timer's id (never 0).
  uint64_t Schedule(Clock::time_point deadline, absl::AnyInvocable<void() &&> callback);
  // True when the timer was pending and will now never run.
  bool Cancel(uint64_t id);
  void Shutdown();

 private:
  void Run();

  absl::Mutex mu_;
  uint64_t last_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::multimap<Clock::time_point, uint64_t> by_deadline_ ABSL_GUARDED_BY(mu_);
  struct Entry {
    Clock::time_point deadline;
    absl::AnyInvocable<void() &&> callback;
  };
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar wakeup_;
  std::thread thread_;
};

}  // namespace tensord::server
