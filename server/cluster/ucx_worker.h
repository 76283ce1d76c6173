// UcxWorker: the one thread that drives this daemon's UcxNode. Over TCP a node serves the
// gets peers make of its registered memory only while its worker progresses, and a worker
// is driven by one thread at a time (ucx_reader.h): so every UCX call of the daemon (register,
// connect, read, release) runs as a task on this thread, and between tasks the thread
// progresses the worker, sleeping on its event fd while nothing happens (no busy polling).
//
// A task runs alone: a long read keeps the thread (it progresses the worker as it goes, so
// the node still serves peers meanwhile), and the next task waits for it. Call() may be used
// from any thread but this one. The destructor runs the tasks already posted, then stops.
#pragma once

#include <deque>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "server/cluster/ucx_reader.h"

namespace tensord::server::cluster {

class UcxWorker {
 public:
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Start();
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // The worker's address, for peers' UcxEndpoint::Connect.
  const std::string& address() const { return node_->address(); }

  // Runs fn(node) on the worker's thread and returns what it returns.
  template <typename F>
  auto Call(F fn) -> std::invoke_result_t<F&, UcxNode&> {
    using R = std::invoke_result_t<F&, UcxNode&>;
    std::promise<R> promise;
    std::future<R> result = promise.get_future();
    Post([&promise, &fn](UcxNode& node) {
      if constexpr (std::is_void_v<R>) {
        fn(node);
        promise.set_value();
      } else {
        promise.set_value(fn(node));
      }
    });
    return result.get();
  }
  // Runs task(node) on the worker's thread later, without waiting for it.
  void Post(absl::AnyInvocable<void(UcxNode&) &&> task);

 private:
  UcxWorker(std::unique_ptr<UcxNode> node, common::UniqueFd wake);
  void Run();

  std::unique_ptr<UcxNode> node_;
  common::UniqueFd wake_;  // an eventfd: a task was posted, or the worker stops
  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void(UcxNode&) &&>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tensord::server::cluster
