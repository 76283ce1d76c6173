// The Broker's bounded work queues (broker.proto's QueueSlot): an allocation that names a
// queue takes one of its slots before its memory is made, or waits, oldest first, while the
// queue is full; the tensor holds the slot until it leaves the queue, and the freed slot
// admits the next waiting allocation. So a full queue holds its producer back before any
// memory is made for it, and the allocation, knowing its namespace, recycles.
#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/names.h"
#include "common/protocol_limits.h"
#include "common/status.h"
#include "server/broker/broker.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

// Checked in this order so that an error quotes only what was found valid already: the
// checks of names describe what is wrong without echoing unreadable bytes.
absl::Status ValidateQueueSlot(const v1::AllocateRequest& request) {
  const v1::QueueSlot& queue = request.queue();
  const std::string& prefix = queue.prefix();
  TENSORD_RETURN_IF_ERROR(common::ValidatePrefix(prefix));
  if (!prefix.ends_with('/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue ", common::QuoteForError(prefix), ": a queue is a prefix ending in '/'"));
  }
  if (!request.ns().empty()) TENSORD_RETURN_IF_ERROR(common::ValidateNamespace(request.ns()));
  if (common::NamespaceOf(prefix) != request.ns()) {
    return absl::InvalidArgumentError(absl::StrCat("queue ", common::QuoteForError(prefix),
                                                   ": allocate in its namespace ",
                                                   common::QuoteForError(common::NamespaceOf(prefix)), ", not ",
                                                   common::QuoteForError(request.ns())));
  }
  if (queue.depth() == 0 || queue.depth() > common::kMaxQueueDepth) {
    return absl::InvalidArgumentError(absl::StrCat("queue ", common::QuoteForError(prefix), ": depth ",
                                                   queue.depth(), " is not between 1 and ", common::kMaxQueueDepth));
  }
  return absl::OkStatus();
}

bool AsksToWait(const v1::QueueSlot& queue) {
  return queue.wait_case() != v1::QueueSlot::WAIT_NOT_SET && (queue.has_forever() || queue.timeout_ms() > 0);
}

}  // namespace

uint64_t Broker::AllocateInQueue(uint64_t session_id, const v1::AllocateRequest& request,
                                 Completion<v1::AllocateResponse> done) {
  if (absl::Status valid = ValidateQueueSlot(request); !valid.ok()) {
    std::move(done)(valid);
    return 0;
  }
  const v1::QueueSlot& queue = request.queue();
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> session = SessionLocked(session_id);
    refused = session.ok() ? access_.CheckAccess((*session)->creds, request.ns(), true) : session.status();
    if (refused.ok() && !queue_slots_.TryHold(queue.prefix(), queue.depth())) {
      if (AsksToWait(queue)) {
        absl::StatusOr<uint64_t> wait_id = StartSlotWaitLocked(**session, request, done);
        if (wait_id.ok()) return *wait_id;
        refused = wait_id.status();
      } else {
        refused = absl::ResourceExhaustedError(absl::StrCat("queue ", common::QuoteForError(queue.prefix()),
                                                            " is full (depth ", queue.depth(), ")"));
      }
    }
  }
  if (!refused.ok()) {
    std::move(done)(refused);
    return 0;
  }
  AllocateNow(session_id, request, GivingSlotBackOnError(queue.prefix(), std::move(done)));
  return 0;
}

absl::StatusOr<uint64_t> Broker::StartSlotWaitLocked(Session& session, const v1::AllocateRequest& request,
                                                     Completion<v1::AllocateResponse>& done) {
  if (shutting_down_) return absl::CancelledError("tensord is shutting down");
  const v1::QueueSlot& queue = request.queue();
  TENSORD_RETURN_IF_ERROR(ReserveWaitLocked(session, queue.prefix()));
  SlotWaiter waiter;
  waiter.session_id = session.id;
  waiter.uid = session.creds.uid;
  waiter.metadata_bytes = kWaitEntryBytes + queue.prefix().size();  // as ReserveWaitLocked charged
  waiter.request = request;
  waiter.done = std::move(done);
  const uint64_t id = queue_slots_.Wait(std::move(waiter));
  if (!queue.has_forever()) {
    const uint64_t ms = std::min(queue.timeout_ms(), common::kMaxDurationMs);
    queue_slots_.Find(id)->timer_id = timers_.Schedule(
        TimerQueue::Clock::now() + std::chrono::milliseconds(ms), [this, id, ms, prefix = queue.prefix()] {
          CompleteSlotWaitWith(id, absl::DeadlineExceededError(absl::StrCat(
                                       "no room in queue ", common::QuoteForError(prefix), " within ", ms, " ms")));
        });
  }
  ++session.waits;
  return id;
}

Completion<v1::AllocateResponse> Broker::GivingSlotBackOnError(std::string prefix,
                                                               Completion<v1::AllocateResponse> done) {
  return [this, prefix = std::move(prefix), done = std::move(done)](absl::StatusOr<v1::AllocateResponse> result) mutable {
    // Success means the tensor was registered holding the slot; a failure registered nothing.
    if (!result.ok()) {
      Effects effects;
      {
        absl::MutexLock lock(&mu_);
        FreeSlotLocked(prefix, effects);
      }
      Deliver(effects);
    }
    std::move(done)(std::move(result));
  };
}

void Broker::FreeSlotLocked(const std::string& prefix, Effects& effects) {
  queue_slots_.Free(prefix);
  AdmitWaitersLocked(prefix, effects);
}

void Broker::AdmitWaitersLocked(const std::string& prefix, Effects& effects) {
  for (SlotWaiter& waiter : queue_slots_.Admit(prefix)) {
    effects.cancel_timers.push_back(waiter.timer_id);
    ForgetSlotWaiterLocked(waiter);
    effects.admitted.push_back(std::move(waiter));
  }
}

void Broker::LeaveQueueLocked(Tensor& tensor, Effects& effects) {
  if (tensor.queue_prefix.empty()) return;
  const std::string prefix = std::move(tensor.queue_prefix);
  tensor.queue_prefix.clear();
  FreeSlotLocked(prefix, effects);
}

absl::Status Broker::CheckQueuedName(const Tensor& tensor, const std::string& name) {
  if (tensor.queue_prefix.empty()) return absl::OkStatus();
  const std::string& prefix = tensor.queue_prefix;
  if (name.size() > prefix.size() && name.starts_with(prefix) && name.find('/', prefix.size()) == std::string::npos) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor.id, " holds a slot of queue ",
                                                 common::QuoteForError(prefix), ": publish it directly under ",
                                                 common::QuoteForError(prefix), ", not as ",
                                                 common::QuoteForError(name)));
}

void Broker::ForgetSlotWaiterLocked(const SlotWaiter& waiter) {
  if (Session* session = sessions_.Find(waiter.session_id); session != nullptr) {
    TENSORD_CHECK(session->waits > 0);
    --session->waits;
  }
  uid_quota_.Release(waiter.uid, UidResource::kWaits, 1);
  uid_quota_.Release(waiter.uid, UidResource::kMetadataBytes, waiter.metadata_bytes);
}

void Broker::CompleteSlotWaitWith(uint64_t wait_id, absl::Status status) {
  std::optional<SlotWaiter> waiter;
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    waiter = queue_slots_.Remove(wait_id);
    if (!waiter) return;
    ForgetSlotWaiterLocked(*waiter);
    // The waiter may have been first in line, ahead of ones that fit now.
    AdmitWaitersLocked(waiter->request.queue().prefix(), effects);
  }
  if (waiter->timer_id != 0) timers_.Cancel(waiter->timer_id);
  std::move(waiter->done)(std::move(status));
  Deliver(effects);
}

void Broker::AllocateAdmitted(std::vector<SlotWaiter> admitted) {
  for (SlotWaiter& waiter : admitted) {
    std::string prefix = waiter.request.queue().prefix();
    AllocateNow(waiter.session_id, waiter.request, GivingSlotBackOnError(std::move(prefix), std::move(waiter.done)));
  }
}

bool Broker::QueueSlotsMatchTensorsForTest() {
  absl::MutexLock lock(&mu_);
  std::map<std::string, uint32_t> holders;
  for (const auto& [id, tensor] : registry_.tensors()) {
    if (!tensor.queue_prefix.empty()) ++holders[tensor.queue_prefix];
  }
  // Allocations in flight hold slots no registered tensor holds yet: none between fuzz ops.
  std::map<std::string, uint32_t> held;
  for (const QueueSlots::QueueState& state : queue_slots_.States()) {
    if (state.held > 0) held[state.prefix] = state.held;
  }
  return holders == held;
}

void Broker::DescribeQueuesLocked(uint64_t session_id, v1::StatusResponse& response) {
  const common::PeerCredentials* caller = nullptr;
  if (session_id != 0) {
    const Session* session = sessions_.Find(session_id);
    if (session == nullptr) return;
    caller = &session->creds;
  }
  for (const QueueSlots::QueueState& state : queue_slots_.States()) {
    if (caller != nullptr && !access_.MayRead(*caller, common::NamespaceOf(state.prefix))) continue;
    v1::QueueStatus& queue = *response.add_queues();
    queue.set_prefix(state.prefix);
    queue.set_depth(state.depth);
    queue.set_slots_held(state.held);
    queue.set_published(registry_.CountUnder(state.prefix));
    queue.set_producers_waiting(state.waiting);
    queue.set_takers_waiting(static_cast<uint32_t>(waiters_.TakesWaitingFor(state.prefix)));
  }
}

}  // namespace tensord::server
