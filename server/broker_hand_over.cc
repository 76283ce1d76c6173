// The Broker's lease hand-overs (HandOverTable): a session turns a lease it holds into a
// one-time token for another process, which redeems it for a lease of its own.
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/protocol_limits.h"
#include "common/status.h"
#include "server/broker.h"
#include "server/random_token.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

absl::StatusOr<v1::HandOverResponse> Broker::HandOver(uint64_t session_id, const v1::HandOverRequest& request) {
  if (request.ttl_ms() > common::kMaxHandOverTtlMs) {
    return absl::InvalidArgumentError(absl::StrCat("hand-over: a TTL of ", request.ttl_ms(),
                                                   " ms is longer than the most a tensor is held for a token, ",
                                                   common::kMaxHandOverTtlMs, " ms (one hour)"));
  }
  const uint64_t ttl_ms = request.ttl_ms() == 0 ? common::kDefaultHandOverTtlMs : request.ttl_ms();
  TENSORD_ASSIGN_OR_RETURN(std::string token, NewRandomToken(common::kHandOverTokenBytes, "a hand-over token"));
  absl::MutexLock lock(&mu_);
  TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
  const Lease* lease = leases_.Find(request.lease_id(), session_id);
  if (lease == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("hand-over: session ", session_id, " holds no lease ", request.lease_id()));
  }
  Tensor* tensor = registry_.Find(lease->tensor_id);
  TENSORD_CHECK(tensor != nullptr);
  if (tensor->state == v1::TENSOR_STATE_CREATING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hand-over: tensor ", tensor->id, " is not published yet; publish it first (unnamed is enough)"));
  }
  TENSORD_RETURN_IF_ERROR(CheckMemoryLiveLocked(*tensor));
  const uid_t uid = session->creds.uid;
  if (const size_t pending = hand_overs_.CountFor(uid); pending >= options_.max_leases_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "hand-over: uid ", uid, " has ", pending, " hand-overs pending, the limit (--max-leases-per-session ",
        options_.max_leases_per_session, "): let receivers redeem them or their TTLs run out first"));
  }
  if (const size_t of_lease = hand_overs_.CountForLease(request.lease_id()); of_lease >= kMaxHandOversPerLease) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "hand-over: lease ", request.lease_id(), " has ", of_lease, " hand-overs pending, the most one lease may have (",
        kMaxHandOversPerLease, "): let receivers redeem them or their TTLs run out first"));
  }
  TENSORD_RETURN_IF_ERROR(
      uid_quota_.Reserve(uid, UidResource::kMetadataBytes, kHandOverEntryBytes, "a pending hand-over"));
  ++tensor->hand_overs;
  const uint64_t timer_id = timers_.Schedule(TimerQueue::Clock::now() + std::chrono::milliseconds(ttl_ms),
                                             [this, token] { ExpireHandOver(token); });
  hand_overs_.Add(token, PendingHandOver{tensor->id, uid, timer_id, request.lease_id()});
  v1::HandOverResponse response;
  response.set_token(std::move(token));
  *response.mutable_tensor() = registry_.Describe(*tensor);
  response.set_ttl_ms(ttl_ms);
  spdlog::debug("session {} handed over tensor {} for {} ms", session_id, tensor->id, ttl_ms);
  return response;
}

absl::StatusOr<v1::AcquireResponse> Broker::RedeemHandOver(uint64_t session_id, std::string_view token) {
  Effects effects;
  absl::StatusOr<v1::AcquireResponse> result;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> session = SessionLocked(session_id);
    const PendingHandOver* pending = session.ok() ? hand_overs_.Find(token) : nullptr;
    if (!session.ok()) {
      result = session.status();
    } else if (pending == nullptr) {
      result = absl::NotFoundError(
          "no such hand-over: it was redeemed already (a token is good for one acquire), its TTL ran "
          "out, or the broker restarted since it was made");
    } else {
      Tensor* tensor = registry_.Find(pending->tensor_id);
      TENSORD_CHECK(tensor != nullptr);  // the hand-over holds it
      if (!access_.MayReadTensor((*session)->creds, *tensor)) {
        result = absl::PermissionDeniedError(absl::StrCat("the tensor handed over (", tensor->id,
                                                          ") was published where uid ", (*session)->creds.uid,
                                                          " may not read it; the hand-over stays pending"));
      } else if (absl::Status live = CheckMemoryLiveLocked(*tensor); !live.ok()) {
        result = live;
        EndHandOverLocked(*hand_overs_.Remove(token), /*cancel_timer=*/true, effects);
      } else if (absl::Status cap = CheckLeaseCapLocked(**session); !cap.ok()) {
        result = cap;
      } else {
        // The lease first: it holds the tensor when the hand-over lets go.
        result = GrantLocked(**session, *tensor);
        EndHandOverLocked(*hand_overs_.Remove(token), /*cancel_timer=*/true, effects);
        spdlog::debug("session {} redeemed a hand-over of tensor {}", session_id, result->tensor().tensor_id());
      }
    }
  }
  Deliver(effects);
  return result;
}

void Broker::ExpireHandOver(const std::string& token) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    std::optional<PendingHandOver> hand_over = hand_overs_.Remove(token);
    if (!hand_over) return;  // redeemed before its timer could be cancelled
    spdlog::debug("a hand-over of tensor {} expired unredeemed", hand_over->tensor_id);
    EndHandOverLocked(*hand_over, /*cancel_timer=*/false, effects);
  }
  Deliver(effects);
}

void Broker::EndHandOverLocked(const PendingHandOver& hand_over, bool cancel_timer, Effects& effects) {
  uid_quota_.Release(hand_over.uid, UidResource::kMetadataBytes, kHandOverEntryBytes);
  if (cancel_timer) effects.cancel_timers.push_back(hand_over.timer_id);
  Tensor* tensor = registry_.Find(hand_over.tensor_id);
  TENSORD_CHECK(tensor != nullptr && tensor->hand_overs > 0);
  --tensor->hand_overs;
  MaybeRemoveLocked(*tensor, effects);
}

}  // namespace tensord::server
