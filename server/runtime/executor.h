// Executor: a few threads for work that may block (a multi-GiB fallocate, the last close
// of a large memfd), so gRPC and fd-channel threads never do. Tasks run in FIFO order per
// thread; Shutdown() finishes queued tasks and joins. Thread-safe.
#pragma once

#include <deque>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace tensord::server {

class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Post(absl::AnyInvocable<void() &&> task);
  void Shutdown();

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tensord::server
