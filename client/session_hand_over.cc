// Session's lease hand-overs: a token for a lease this session holds, and a lease of its
// own from a token another process made.
#include <string>
#include <utility>

#include "client/session.h"
#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "common/protocol_limits.h"
#include "common/status.h"

namespace tensord::internal {

absl::StatusOr<HandOverToken> Session::HandOver(const LeaseView& view, std::chrono::milliseconds ttl) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const std::string what = "hand over tensor " + std::to_string(view.tensor_id());
  if (view.session_id() != session_id()) {
    return absl::FailedPreconditionError(what + ": its lease is another session's (this client's earlier one, or "
                                                "the parent process's before a fork): acquire it again here first");
  }
  if (ttl.count() < 0 || static_cast<uint64_t>(ttl.count()) > common::kMaxHandOverTtlMs) {
    return absl::InvalidArgumentError(what + ": a TTL of " + std::to_string(ttl.count()) + " ms; give 0 (60 s) to " +
                                      std::to_string(common::kMaxHandOverTtlMs) + " ms (one hour)");
  }
  tensord::v1::SessionRequest request;
  request.mutable_hand_over()->set_lease_id(view.lease_id());
  request.mutable_hand_over()->set_ttl_ms(static_cast<uint64_t>(ttl.count()));
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionResponse response,
                           channel_.StreamCall(std::move(request), kDefaultCallTimeout));
  if (!response.has_hand_over()) return absl::InternalError(what + ": the broker answered with something else");
  TENSORD_ASSIGN_OR_RETURN(ValidatedTensor valid, ValidateTensorInfo(response.hand_over().tensor(), what));
  HandOverToken token;
  token.token = std::move(*response.mutable_hand_over()->mutable_token());
  token.tensor = std::move(valid.info);
  token.ttl = std::chrono::milliseconds(response.hand_over().ttl_ms());
  return token;
}

absl::StatusOr<LeaseView*> Session::Redeem(std::string_view token, const AcquireOptions& options) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const std::string what = "redeem a hand-over";
  // Checked here so that nothing else goes to the broker as one; the token is never quoted.
  if (token.empty() || token.size() > 2 * common::kHandOverTokenBytes) {
    return absl::InvalidArgumentError(what + ": not a hand-over token (" + std::to_string(token.size()) +
                                      " characters; a token has " +
                                      std::to_string(2 * common::kHandOverTokenBytes) + ")");
  }
  tensord::v1::SessionRequest request;
  request.mutable_acquire()->set_hand_over(std::string(token));
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionResponse response,
                           channel_.StreamCall(std::move(request), kDefaultCallTimeout));
  if (!response.has_acquire()) return absl::InternalError(what + ": the broker answered with something else");
  const tensord::v1::AcquireResponse& acquire = response.acquire();
  return LeaseAdopter::Ordered(adopter_.AdoptLease(acquire.lease_id(), acquire.tensor(), GrantedFence::Of(acquire),
                                                   ConsumerViewKind(options), "", what),
                               options.stream);
}

}  // namespace tensord::internal
