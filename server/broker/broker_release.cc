// The Broker's releases: leases given back in batches, each tensor going once nothing holds
// it (its memory freed off the request threads, or kept in its producer's pool).
#include "absl/strings/str_cat.h"
#include "common/protocol_limits.h"
#include "server/broker/broker.h"

namespace tensord::server {

namespace v1 = tensord::v1;

absl::StatusOr<v1::ReleaseResponse> Broker::Release(uint64_t session_id,
                                                    const v1::ReleaseRequest& request) {
  if (static_cast<size_t>(request.lease_ids_size()) > common::kMaxReleaseBatch) {
    // All or nothing: releasing a prefix would leave the caller unsure what it still holds.
    return absl::InvalidArgumentError(absl::StrCat("release: lease_ids has ", request.lease_ids_size(),
                                                   " entries, at most ", common::kMaxReleaseBatch,
                                                   " per request; nothing was released"));
  }
  v1::ReleaseResponse response;
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    Session* session = sessions_.Find(session_id);
    for (uint64_t lease_id : request.lease_ids()) {
      Tensor* tensor = session == nullptr ? nullptr : leases_.Drop(*session, lease_id);
      if (tensor == nullptr) {
        ++releases_not_found_;
        response.add_not_found(lease_id);
        continue;
      }
      MaybeRemoveLocked(*tensor, effects);
      response.set_released(response.released() + 1);
    }
  }
  Deliver(effects);
  return response;
}

}  // namespace tensord::server
