#include "server/state/queue_slots.h"

#include <utility>

#include "common/check.h"

namespace tensord::server {

bool QueueSlots::TryHold(const std::string& prefix, uint32_t depth) {
  Queue& queue = queues_[prefix];
  queue.depth = depth;
  if (!queue.waiting.empty() || queue.held >= depth) return false;
  ++queue.held;
  return true;
}

void QueueSlots::Hold(const std::string& prefix) { ++queues_[prefix].held; }

void QueueSlots::Free(const std::string& prefix) {
  auto queue = queues_.find(prefix);
  TENSORD_CHECK(queue != queues_.end() && queue->second.held > 0);
  --queue->second.held;
  ForgetIfIdle(queue);
}

std::vector<SlotWaiter> QueueSlots::Admit(const std::string& prefix) {
  std::vector<SlotWaiter> admitted;
  auto queue = queues_.find(prefix);
  if (queue == queues_.end()) return admitted;
  Queue& q = queue->second;
  while (!q.waiting.empty()) {
    auto entry = waiters_.find(q.waiting.front());
    TENSORD_CHECK(entry != waiters_.end());
    if (q.held >= entry->second.request.queue().depth()) break;
    ++q.held;
    q.waiting.pop_front();
    admitted.push_back(std::move(entry->second));
    waiters_.erase(entry);
  }
  return admitted;
}

uint64_t QueueSlots::Wait(SlotWaiter waiter) {
  const uint64_t id = ++last_id_;
  Queue& queue = queues_[waiter.request.queue().prefix()];
  queue.depth = waiter.request.queue().depth();
  queue.waiting.push_back(id);
  waiters_.emplace(id, std::move(waiter));
  return id;
}

SlotWaiter* QueueSlots::Find(uint64_t wait_id) {
  auto entry = waiters_.find(wait_id);
  return entry == waiters_.end() ? nullptr : &entry->second;
}

SlotWaiter QueueSlots::RemoveEntry(std::map<uint64_t, SlotWaiter>::iterator entry) {
  auto queue = queues_.find(entry->second.request.queue().prefix());
  TENSORD_CHECK(queue != queues_.end());
  std::erase(queue->second.waiting, entry->first);
  SlotWaiter waiter = std::move(entry->second);
  waiters_.erase(entry);
  ForgetIfIdle(queue);
  return waiter;
}

std::optional<SlotWaiter> QueueSlots::Remove(uint64_t wait_id) {
  auto entry = waiters_.find(wait_id);
  if (entry == waiters_.end()) return std::nullopt;
  return RemoveEntry(entry);
}

std::vector<SlotWaiter> QueueSlots::RemoveSession(uint64_t session_id) {
  std::vector<SlotWaiter> removed;
  for (auto entry = waiters_.begin(); entry != waiters_.end();) {
    auto next = std::next(entry);
    if (entry->second.session_id == session_id) removed.push_back(RemoveEntry(entry));
    entry = next;
  }
  return removed;
}

std::vector<SlotWaiter> QueueSlots::RemoveAll() {
  std::vector<SlotWaiter> removed;
  while (!waiters_.empty()) removed.push_back(RemoveEntry(waiters_.begin()));
  return removed;
}

std::vector<QueueSlots::QueueState> QueueSlots::States() const {
  std::vector<QueueState> states;
  states.reserve(queues_.size());
  for (const auto& [prefix, queue] : queues_) {
    states.push_back(QueueState{prefix, queue.held, queue.depth, static_cast<uint32_t>(queue.waiting.size())});
  }
  return states;
}

void QueueSlots::ForgetIfIdle(std::map<std::string, Queue>::iterator queue) {
  if (queue->second.held == 0 && queue->second.waiting.empty()) queues_.erase(queue);
}

}  // namespace tensord::server
