// The Broker's lease hand-overs (HandOverTable): a session turns a lease it holds into a
// one-time token for another process, which redeems it for a lease of its own.
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/protocol_limits.h"
#include "common/status.h"
#include "server/broker/broker.h"
#include "server/runtime/random_token.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

// How long a hand-over waits for its redeemer: the TTL asked for, at most an hour, by default
// a minute.
absl::StatusOr<uint64_t> HandOverTtl(const v1::HandOverRequest& request) {
  if (request.ttl_ms() > common::kMaxHandOverTtlMs) {
    return absl::InvalidArgumentError(absl::StrCat("hand-over: a TTL of ", request.ttl_ms(),
                                                   " ms is longer than the most a tensor is held for a token, ",
                                                   common::kMaxHandOverTtlMs, " ms (one hour)"));
  }
  return request.ttl_ms() == 0 ? common::kDefaultHandOverTtlMs : request.ttl_ms();
}

}  // namespace

absl::StatusOr<v1::HandOverResponse> Broker::HandOver(uint64_t session_id, const v1::HandOverRequest& request) {
  TENSORD_ASSIGN_OR_RETURN(const uint64_t ttl_ms, HandOverTtl(request));
  TENSORD_ASSIGN_OR_RETURN(std::string token, NewRandomToken(common::kHandOverTokenBytes, "a hand-over token"));
  absl::MutexLock lock(&mu_);
  TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
  TENSORD_ASSIGN_OR_RETURN(Tensor * tensor, HandedOverTensorLocked(session_id, request.lease_id()));
  const uid_t uid = session->creds.uid;
  TENSORD_RETURN_IF_ERROR(CheckHandOverCapsLocked(uid, request.lease_id()));
  PendingHandOver hand_over = NewHandOverLocked(*tensor, uid, request.lease_id());
  TENSORD_RETURN_IF_ERROR(ChargeHandOverLocked(hand_over));
  ++tensor->hand_overs;
  hand_over.timer_id = timers_.Schedule(TimerQueue::Clock::now() + std::chrono::milliseconds(ttl_ms),
                                        [this, token] { ExpireHandOver(token); });
  hand_overs_.Add(token, hand_over);
  v1::HandOverResponse response;
  response.set_token(std::move(token));
  *response.mutable_tensor() = registry_.Describe(*tensor);
  response.set_ttl_ms(ttl_ms);
  spdlog::debug("session {} handed over tensor {} for {} ms", session_id, tensor->id, ttl_ms);
  return response;
}

absl::StatusOr<Tensor*> Broker::HandedOverTensorLocked(uint64_t session_id, uint64_t lease_id) {
  const Lease* lease = leases_.Find(lease_id, session_id);
  if (lease == nullptr) {
    return absl::NotFoundError(absl::StrCat("hand-over: session ", session_id, " holds no lease ", lease_id));
  }
  Tensor* tensor = registry_.Find(lease->tensor_id);
  TENSORD_CHECK(tensor != nullptr);
  if (tensor->state == v1::TENSOR_STATE_CREATING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hand-over: tensor ", tensor->id, " is not published yet; publish it first (unnamed is enough)"));
  }
  TENSORD_RETURN_IF_ERROR(CheckMemoryLiveLocked(*tensor));
  return tensor;
}

absl::Status Broker::CheckHandOverCapsLocked(uid_t uid, uint64_t lease_id) const {
  if (const size_t pending = hand_overs_.CountFor(uid); pending >= options_.max_leases_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "hand-over: uid ", uid, " has ", pending, " hand-overs pending, the limit (--max-leases-per-session ",
        options_.max_leases_per_session, "): let receivers redeem them or their TTLs run out first"));
  }
  if (const size_t of_lease = hand_overs_.CountForLease(lease_id); of_lease >= kMaxHandOversPerLease) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "hand-over: lease ", lease_id, " has ", of_lease, " hand-overs pending, the most one lease may have (",
        kMaxHandOversPerLease, "): let receivers redeem them or their TTLs run out first"));
  }
  return absl::OkStatus();
}

PendingHandOver Broker::NewHandOverLocked(const Tensor& tensor, uid_t uid, uint64_t lease_id) {
  // The memory it will hold alive, whoever else holds it: the token may outlive every other hold.
  PendingHandOver hand_over{tensor.id, uid, 0, lease_id};
  if (tensor.buffer_id != 0) {
    const Buffer* buffer = registry_.FindBuffer(tensor.buffer_id);
    TENSORD_CHECK(buffer != nullptr);
    hand_over.bytes = tensor.slot_bytes > 0 ? tensor.slot_bytes : buffer->size;
    hand_over.host = buffer->device == &backends_->host();
  }
  const bool charged_as_producer = tensor.producer_uid == uid && tensor.uid_host_bytes > 0;
  hand_over.charged_host_bytes = hand_over.host && !charged_as_producer ? hand_over.bytes : 0;
  return hand_over;
}

absl::Status Broker::ChargeHandOverLocked(const PendingHandOver& hand_over) {
  const uid_t uid = hand_over.uid;
  // Its uid's first token on the tensor pins the memory; later ones pin nothing more.
  const uint64_t pin = hand_overs_.Pins(uid, hand_over.tensor_id) ? 0 : hand_over.charged_host_bytes;
  TENSORD_RETURN_IF_ERROR(uid_quota_.Reserve(
      uid, UidResource::kHostBytes, pin,
      absl::StrCat("hand-over: keeping tensor ", hand_over.tensor_id, " for a token (its memory counts against its "
                   "maker until the token is redeemed, expires or is cancelled)")));
  if (absl::Status charged =
          uid_quota_.Reserve(uid, UidResource::kMetadataBytes, kHandOverEntryBytes, "a pending hand-over");
      !charged.ok()) {
    uid_quota_.Release(uid, UidResource::kHostBytes, pin);
    return charged;
  }
  return absl::OkStatus();
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
      if (!access_.MayReadIn((*session)->creds, tensor->ns, tensor->producer_uid)) {
        result = absl::PermissionDeniedError(absl::StrCat("the tensor handed over (", tensor->id,
                                                          ") was published where uid ", (*session)->creds.uid,
                                                          " may not read it; the hand-over stays pending"));
      } else if (absl::Status live = CheckMemoryLiveLocked(*tensor); !live.ok()) {
        result = live;
        EndHandOverLocked(*hand_overs_.Remove(token), /*cancel_timer=*/true, effects);
      } else if (result = GrantWithinCapLocked(**session, *tensor); result.ok()) {
        // The lease first: it holds the tensor when the hand-over lets go.
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
  // Removed from hand_overs_ already: no token of its uid left on the tensor ends the pin.
  if (!hand_overs_.Pins(hand_over.uid, hand_over.tensor_id)) {
    uid_quota_.Release(hand_over.uid, UidResource::kHostBytes, hand_over.charged_host_bytes);
  }
  if (cancel_timer) effects.cancel_timers.push_back(hand_over.timer_id);
  Tensor* tensor = registry_.Find(hand_over.tensor_id);
  TENSORD_CHECK(tensor != nullptr && tensor->hand_overs > 0);
  --tensor->hand_overs;
  MaybeRemoveLocked(*tensor, effects);
}

absl::StatusOr<v1::CancelHandOversResponse> Broker::CancelHandOvers(uint64_t session_id,
                                                                    const v1::CancelHandOversRequest& request) {
  if (static_cast<size_t>(request.tokens_size()) > common::kMaxCancelHandOversBatch) {
    return absl::InvalidArgumentError(absl::StrCat("cancel hand-overs: ", request.tokens_size(),
                                                   " tokens; at most ", common::kMaxCancelHandOversBatch,
                                                   " per request (none was cancelled)"));
  }
  Effects effects;
  v1::CancelHandOversResponse response;
  {
    absl::MutexLock lock(&mu_);
    TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
    const uid_t uid = session->creds.uid;
    std::vector<std::string> tokens = request.tokens().empty()
                                          ? hand_overs_.TokensOf(uid)
                                          : std::vector<std::string>(request.tokens().begin(), request.tokens().end());
    for (const std::string& token : tokens) {
      // Another uid's token is not found, as one never made is: nothing to learn by asking.
      const PendingHandOver* pending = hand_overs_.Find(token);
      if (pending == nullptr || pending->uid != uid) {
        response.set_not_found(response.not_found() + 1);
        continue;
      }
      EndHandOverLocked(*hand_overs_.Remove(token), /*cancel_timer=*/true, effects);
      response.set_cancelled(response.cancelled() + 1);
    }
    if (response.cancelled() > 0) {
      spdlog::debug("session {} (uid {}) cancelled {} hand-overs", session_id, uid, response.cancelled());
    }
  }
  Deliver(effects);
  return response;
}

void Broker::DescribeHandOversLocked(uint64_t session_id, v1::StatusResponse& response) {
  std::optional<uid_t> only_uid;  // nullopt: every uid
  if (!StatusScopeLocked(session_id, only_uid)) return;
  std::map<uid_t, HandOverPins> sorted;  // one entry per uid with a hand-over pending
  if (only_uid) {
    if (HandOverPins pins = hand_overs_.PinsOf(*only_uid); pins.hand_overs > 0) sorted.emplace(*only_uid, pins);
  } else {
    sorted.insert(hand_overs_.pins_by_uid().begin(), hand_overs_.pins_by_uid().end());
  }
  for (const auto& [uid, pins] : sorted) {
    v1::HandOverUsage& usage = *response.add_hand_over_usage();
    usage.set_uid(uid);
    usage.set_hand_overs(pins.hand_overs);
    usage.set_host_bytes(pins.host_bytes);
    usage.set_device_bytes(pins.device_bytes);
  }
}

}  // namespace tensord::server
