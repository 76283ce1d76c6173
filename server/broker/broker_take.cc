// The Broker's takes: a take grants a lease on the tensor bound to a name, or on the oldest
// bound under a prefix (a queue), and unbinds it, so that each tensor goes to one taker.
// With a wait, a take that finds nothing waits for the next publish it matches.
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status.h"
#include "server/broker/broker.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

// A take names one name, or a prefix ending in '/'.
absl::Status ValidateTakeTarget(const std::string& target) {
  TENSORD_RETURN_IF_ERROR(target.ends_with('/') ? common::ValidatePrefix(target) : common::ValidateName(target));
  if (target.empty()) return absl::InvalidArgumentError("take: give a name or a prefix");
  return absl::OkStatus();
}

}  // namespace

absl::Status Broker::CheckTakenMemory(v1::DeviceType wanted, const Tensor& tensor) {
  const v1::DeviceType memory = tensor.desc.device().type();
  if (wanted == v1::DEVICE_TYPE_UNSPECIFIED || memory == wanted) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor.id, " (", common::QuoteForError(tensor.name),
                                                 ") is ", v1::DeviceType_Name(memory),
                                                 " memory and this take maps only ", v1::DeviceType_Name(wanted),
                                                 " memory; it stays bound"));
}

uint64_t Broker::Take(uint64_t session_id, const v1::TakeRequest& request,
                      Completion<v1::AcquireResponse> done) {
  return TakeHere(session_id, request, std::move(done), /*may_fetch=*/true);
}

uint64_t Broker::TakeHere(uint64_t session_id, const v1::TakeRequest& request,
                          Completion<v1::AcquireResponse> done, bool may_fetch) {
  const std::string& target = request.name_or_prefix();
  if (absl::Status valid = ValidateTakeTarget(target); !valid.ok()) {
    std::move(done)(valid);
    return 0;
  }
  std::optional<absl::StatusOr<v1::AcquireResponse>> result;  // empty: wait
  RemoteNames* fetch_from = nullptr;  // set: one is moved here from another node
  uint64_t wait_id = 0;
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> session = SessionLocked(session_id);
    absl::Status access = session.ok() ? access_.CheckAccess((*session)->creds, common::NamespaceOf(target), true)
                                       : session.status();
    if (access.ok()) access = CheckNamesMayChangeLocked();  // a take unbinds
    if (!access.ok()) {
      result = access;
    } else {
      result = TakeNowLocked(**session, request, effects);
      // Nothing here: another node may have one.
      const bool none = !result || (!result->ok() && result->status().code() == absl::StatusCode::kNotFound);
      if (may_fetch && none && remote_ != nullptr && remote_->Shares(target)) fetch_from = remote_;
    }
    if (!result) {
      Waiter waiter;
      waiter.kind = Waiter::Kind::kTake;
      waiter.target = target;
      waiter.memory_type = request.memory_type();
      std::optional<uint64_t> timeout;  // nullopt: forever
      if (!request.has_forever()) timeout = request.timeout_ms();
      absl::StatusOr<uint64_t> started = StartWaitLocked(**session, std::move(waiter), done, timeout, "take");
      if (started.ok()) {
        wait_id = *started;
      } else {
        result = started.status();
        fetch_from = nullptr;
      }
    }
  }
  Deliver(effects);
  if (wait_id != 0) {
    // The moved tensor's bind grants the wait (or another take's, which got it first).
    if (fetch_from != nullptr) {
      fetch_from->FetchTake(target, [this, wait_id](absl::Status fetched) {
        if (!fetched.ok() && fetched.code() != absl::StatusCode::kNotFound) CompleteWaitWith(wait_id, std::move(fetched));
      });
    }
    return wait_id;
  }
  if (fetch_from != nullptr) {
    fetch_from->FetchTake(target, [this, session_id, request, done = std::move(done)](absl::Status fetched) mutable {
      if (!fetched.ok()) {
        std::move(done)(std::move(fetched));  // moved: the status is released where it is used
      } else {
        TakeHere(session_id, request, std::move(done), /*may_fetch=*/false);
      }
    });
    return 0;
  }
  std::move(done)(std::move(*result));
  return 0;
}

std::optional<absl::StatusOr<v1::AcquireResponse>> Broker::TakeNowLocked(Session& session,
                                                                          const v1::TakeRequest& request,
                                                                          Effects& effects) {
  const std::string& target = request.name_or_prefix();
  const bool prefix = target.ends_with('/');
  Tensor* tensor = prefix ? registry_.OldestUnder(target) : registry_.FindByName(target);
  if (tensor == nullptr) {
    if (AsksToWait(request)) return std::nullopt;
    if (prefix) return absl::NotFoundError(absl::StrCat("nothing is bound under ", common::QuoteForError(target)));
    return NotBoundLocked("nothing is bound to ", target);
  }
  TENSORD_RETURN_IF_ERROR(CheckTakenMemory(request.memory_type(), *tensor));
  absl::StatusOr<v1::AcquireResponse> granted = GrantWithinCapLocked(session, *tensor);
  if (granted.ok()) UnbindLocked(*tensor, effects);
  return granted;
}

}  // namespace tensord::server
