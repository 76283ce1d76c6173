// The Broker's waits: an acquire or take that waits for a name is a Waiter (state/wait_queue.h)
// with a timer; a publish grants the waiters it satisfies (WakeWaitersLocked), checking the
// waiter's access and lease cap again as it grants; a timeout, a cancel or shutdown ends
// a wait with its status.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/names.h"
#include "common/protocol_limits.h"
#include "common/status.h"
#include "server/broker/broker.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

template <typename Request>
bool AsksToWaitImpl(const Request& request) {
  return request.wait_case() != Request::WAIT_NOT_SET &&
         (request.has_forever() ? request.forever() : request.timeout_ms() > 0);
}

}  // namespace

bool AsksToWait(const v1::AcquireRequest& request) { return AsksToWaitImpl(request); }
bool AsksToWait(const v1::TakeRequest& request) { return AsksToWaitImpl(request); }

absl::Status Broker::ReserveWaitLocked(const Session& session, std::string_view target) {
  TENSORD_RETURN_IF_ERROR(CheckWaitCapLocked(session));
  const uid_t uid = session.creds.uid;
  TENSORD_RETURN_IF_ERROR(uid_quota_.Reserve(uid, UidResource::kWaits, 1, "waiting"));
  absl::Status charged =
      uid_quota_.Reserve(uid, UidResource::kMetadataBytes, kWaitEntryBytes + target.size(), "waiting");
  if (!charged.ok()) uid_quota_.Release(uid, UidResource::kWaits, 1);
  return charged;
}

absl::StatusOr<uint64_t> Broker::StartWaitLocked(Session& session, Waiter waiter,
                                                 Completion<v1::AcquireResponse>& done,
                                                 std::optional<uint64_t> timeout_ms, std::string_view what) {
  if (shutting_down_) return absl::CancelledError("tensord is shutting down");
  TENSORD_RETURN_IF_ERROR(ReserveWaitLocked(session, waiter.target));
  waiter.session_id = session.id;
  waiter.uid = session.creds.uid;
  waiter.metadata_bytes = kWaitEntryBytes + waiter.target.size();  // as ReserveWaitLocked charged
  waiter.done = std::move(done);
  uint64_t id = waiters_.Add(std::move(waiter));
  if (timeout_ms) {
    uint64_t ms = std::min(*timeout_ms, common::kMaxDurationMs);
    waiters_.Find(id)->timer_id = timers_.Schedule(
        TimerQueue::Clock::now() + std::chrono::milliseconds(ms),
        [this, id, ms, what = std::string(what)] {
          CompleteWaitWith(id, absl::DeadlineExceededError(
                                   absl::StrCat("nothing to ", what, " within ", ms, " ms")));
        });
  }
  ++session.waits;
  return id;
}

void Broker::ForgetWaiterLocked(const Waiter& waiter) {
  if (Session* session = sessions_.Find(waiter.session_id); session != nullptr) {
    TENSORD_CHECK(session->waits > 0);
    --session->waits;
  }
  uid_quota_.Release(waiter.uid, UidResource::kWaits, 1);
  uid_quota_.Release(waiter.uid, UidResource::kMetadataBytes, waiter.metadata_bytes);
}

absl::Status Broker::CheckGrantLocked(const Session& session, const Waiter& waiter, const Tensor& tensor) const {
  if (waiter.kind == Waiter::Kind::kTake) {
    TENSORD_RETURN_IF_ERROR(access_.CheckAccess(session.creds, common::NamespaceOf(tensor.name), true));
    return CheckTakenMemory(waiter.memory_type, tensor);
  }
  if (access_.MayReadIn(session.creds, tensor.ns, tensor.producer_uid)) return absl::OkStatus();
  // The namespace is not named: an id waiter need not learn where the tensor went.
  return absl::PermissionDeniedError(absl::StrCat("tensor ", tensor.id, " was published where uid ",
                                                  session.creds.uid, " may not read it"));
}

void Broker::CompleteWaitWith(uint64_t wait_id, absl::Status status) {
  std::optional<Waiter> waiter;
  {
    absl::MutexLock lock(&mu_);
    waiter = waiters_.Remove(wait_id);
    if (!waiter) return;
    ForgetWaiterLocked(*waiter);
  }
  if (waiter->timer_id != 0) timers_.Cancel(waiter->timer_id);
  std::move(waiter->done)(std::move(status));
}

void Broker::CancelWait(uint64_t wait_id) {
  if (wait_id >= QueueSlots::kFirstWaitId) {
    CompleteSlotWaitWith(wait_id, absl::CancelledError("the wait for a queue slot was cancelled"));
  } else {
    CompleteWaitWith(wait_id, absl::CancelledError("the wait was cancelled"));
  }
}

void Broker::WakeWaitersLocked(Tensor& tensor, Effects& effects) {
  // Acquirers first: they all get the tensor. Then the oldest matching take that may have
  // it, which unbinds it.
  WaitQueue::Matches matches = waiters_.Match(tensor);
  for (uint64_t wait_id : matches.acquires) GrantWaiterLocked(wait_id, tensor, effects);
  for (uint64_t wait_id : matches.takes) {
    if (GrantWaiterLocked(wait_id, tensor, effects)) {
      UnbindLocked(tensor, effects);
      return;
    }
  }
}

bool Broker::GrantWaiterLocked(uint64_t wait_id, Tensor& tensor, Effects& effects) {
  std::optional<Waiter> waiter = waiters_.Remove(wait_id);
  TENSORD_CHECK(waiter.has_value());
  Session* session = sessions_.Find(waiter->session_id);
  TENSORD_CHECK(session != nullptr);  // closing a session removes its waiters
  effects.cancel_timers.push_back(waiter->timer_id);
  // Checked while the waiter's own charges are still held, as a lease is granted.
  absl::Status grantable = CheckGrantLocked(*session, *waiter, tensor);
  if (grantable.ok()) grantable = CheckLeaseCapLocked(*session);
  if (!grantable.ok()) {
    // The waiter fails; the tensor stays for the next one (a take does not unbind).
    effects.completions.emplace_back(std::move(waiter->done), std::move(grantable));
    ForgetWaiterLocked(*waiter);
    return false;
  }
  effects.completions.emplace_back(
      std::move(waiter->done), GrantLocked(*session, tensor, waiter->kind == Waiter::Kind::kAcquireName));
  ForgetWaiterLocked(*waiter);
  return true;
}

}  // namespace tensord::server
