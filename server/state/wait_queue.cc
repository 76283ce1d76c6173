#include "server/state/wait_queue.h"

#include <utility>

#include "common/names.h"

namespace tensord::server {

uint64_t WaitQueue::Add(Waiter waiter) {
  uint64_t id = ++last_id_;
  waiters_.emplace(id, std::move(waiter));
  return id;
}

Waiter* WaitQueue::Find(uint64_t wait_id) {
  auto it = waiters_.find(wait_id);
  return it == waiters_.end() ? nullptr : &it->second;
}

std::optional<Waiter> WaitQueue::Remove(uint64_t wait_id) {
  auto it = waiters_.find(wait_id);
  if (it == waiters_.end()) return std::nullopt;
  Waiter waiter = std::move(it->second);
  waiters_.erase(it);
  return waiter;
}

std::vector<Waiter> WaitQueue::RemoveSession(uint64_t session_id) {
  std::vector<Waiter> removed;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.session_id != session_id) {
      ++it;
      continue;
    }
    removed.push_back(std::move(it->second));
    it = waiters_.erase(it);
  }
  return removed;
}

WaitQueue::Matches WaitQueue::Match(const Tensor& tensor) const {
  Matches matches;
  for (const auto& [id, waiter] : waiters_) {
    switch (waiter.kind) {
      case Waiter::Kind::kAcquireName:
        if (!tensor.name.empty() && waiter.target == tensor.name && tensor.generation >= waiter.min_generation) {
          matches.acquires.push_back(id);
        }
        break;
      case Waiter::Kind::kAcquireId:
        if (waiter.tensor_id == tensor.id) matches.acquires.push_back(id);
        break;
      case Waiter::Kind::kTake:
        if (!tensor.name.empty() &&
            (waiter.target == tensor.name ||
             (waiter.target.ends_with('/') && common::NameHasPrefix(tensor.name, waiter.target)))) {
          matches.takes.push_back(id);
        }
        break;
    }
  }
  return matches;
}

std::vector<uint64_t> WaitQueue::Ids() const {
  std::vector<uint64_t> ids;
  ids.reserve(waiters_.size());
  for (const auto& [id, waiter] : waiters_) ids.push_back(id);
  return ids;
}

size_t WaitQueue::TakesWaitingFor(const std::string& prefix) const {
  size_t count = 0;
  for (const auto& [id, waiter] : waiters_) {
    if (waiter.kind == Waiter::Kind::kTake && waiter.target == prefix) ++count;
  }
  return count;
}

}  // namespace tensord::server
