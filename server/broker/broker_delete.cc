// The Broker's deletes: a name unbound on request (if still at the generation asked for).
// The tensor goes once nothing else holds it.
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status.h"
#include "server/broker/broker.h"

namespace tensord::server {

namespace v1 = tensord::v1;

absl::StatusOr<v1::DeleteResponse> Broker::Delete(uint64_t session_id, const v1::DeleteRequest& request) {
  TENSORD_RETURN_IF_ERROR(common::ValidateName(request.name()));
  Effects effects;
  v1::DeleteResponse response;
  {
    absl::MutexLock lock(&mu_);
    TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
    TENSORD_RETURN_IF_ERROR(access_.CheckAccess(session->creds, common::NamespaceOf(request.name()), true));
    TENSORD_RETURN_IF_ERROR(CheckNamesMayChangeLocked());
    Tensor* tensor = registry_.FindByName(request.name());
    if (tensor == nullptr) {
      return NotBoundLocked("no tensor is bound to ", request.name());
    }
    if (request.if_generation() != 0 && tensor->generation != request.if_generation()) {
      return absl::AbortedError(absl::StrCat(common::QuoteForError(request.name()), " is at generation ",
                                             tensor->generation, ", not ", request.if_generation()));
    }
    response.set_tensor_id(tensor->id);
    response.set_generation(tensor->generation);
    UnbindLocked(*tensor, effects);
  }
  Deliver(effects);
  return response;
}

}  // namespace tensord::server
