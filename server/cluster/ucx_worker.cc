#include "server/cluster/ucx_worker.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tensord::server::cluster {

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Start() {
  absl::StatusOr<std::unique_ptr<UcxNode>> node = UcxNode::Create();
  if (!node.ok()) return node.status();
  common::UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return absl::InternalError(absl::StrCat("ucx worker: eventfd: ", strerror(errno)));
  return std::unique_ptr<UcxWorker>(new UcxWorker(*std::move(node), std::move(wake)));
}

UcxWorker::UcxWorker(std::unique_ptr<UcxNode> node, common::UniqueFd wake)
    : node_(std::move(node)), wake_(std::move(wake)) {
  thread_ = std::thread([this] { Run(); });
}

UcxWorker::~UcxWorker() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  thread_.join();
}

void UcxWorker::Post(absl::AnyInvocable<void(UcxNode&) &&> task) {
  {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
}

void UcxWorker::Run() {
  for (;;) {
    std::deque<absl::AnyInvocable<void(UcxNode&) &&>> tasks;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      tasks.swap(tasks_);
      stopping = stopping_;
    }
    for (auto& task : tasks) std::move(task)(*node_);
    if (stopping && tasks.empty()) return;
    if (!tasks.empty()) continue;  // more may have come meanwhile
    while (node_->Progress()) {
    }
    if (!node_->Arm()) continue;  // events came in since: progress again
    pollfd fds[2] = {{node_->event_fd(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    (void)poll(fds, 2, /*timeout_ms=*/1000);
    uint64_t count = 0;
    (void)!read(wake_.get(), &count, sizeof(count));
  }
}

}  // namespace tensord::server::cluster
