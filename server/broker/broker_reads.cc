// The Broker's reads: acquire (by name, id or, waiting, in broker_waits.cc), list and stat.
// Take, Delete and Release change what is held and have their own files, as have the waits,
// status and watchers.

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/protocol_limits.h"
#include "common/status.h"
#include "server/broker/broker.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

// The wait an acquire by name or by id would be: what it matches.
absl::StatusOr<Waiter> AcquireWaiter(const v1::AcquireRequest& request) {
  Waiter waiter;
  if (request.target_case() == v1::AcquireRequest::kName) {
    TENSORD_RETURN_IF_ERROR(common::ValidateName(request.name()));
    waiter.kind = Waiter::Kind::kAcquireName;
    waiter.target = request.name();
    waiter.min_generation = request.min_generation();
  } else if (request.target_case() == v1::AcquireRequest::kTensorId) {
    waiter.kind = Waiter::Kind::kAcquireId;
    waiter.tensor_id = request.tensor_id();
  } else {
    return absl::InvalidArgumentError("acquire: give a name, a tensor_id or a hand_over token");
  }
  return waiter;
}

// The checks of List's request: a prefix, and a page token that is a name under it.
absl::Status ValidateList(const v1::ListRequest& request) {
  const std::string& prefix = request.prefix();
  const std::string& token = request.page_token();
  TENSORD_RETURN_IF_ERROR(common::ValidatePrefix(prefix));
  if (!token.empty() && (!common::ValidateName(token).ok() || !common::NameHasPrefix(token, prefix))) {
    return absl::InvalidArgumentError(absl::StrCat("list ", common::QuoteForError(prefix),
                                                   ": page_token is not a name under the prefix; pass the "
                                                   "next_page_token of the last answer for the same prefix"));
  }
  return absl::OkStatus();
}

// One answer of List: its entries, in name order, until it holds the most entries or bytes a
// page may (next_page_token: its last name). An unpaged answer too large for one message
// counts the names it would have held instead, to refuse them all with their number.
class ListPage {
 public:
  explicit ListPage(const v1::ListRequest& request)
      : paged_(request.page_size() > 0),
        max_entries_(paged_ ? std::min<size_t>(request.page_size(), common::kMaxListPageEntries)
                            : std::numeric_limits<size_t>::max()),
        max_bytes_(paged_ ? common::kMaxListPageBytes : common::kMaxUnpagedListBytes) {}

  // The next listed tensor; false when the page is full (list no more).
  bool Offer(const TensorRegistry& registry, const Tensor& tensor) {
    if (unsent_ > 0) {
      ++unsent_;
      return true;
    }
    const size_t entries = static_cast<size_t>(response_.tensors_size());
    if (entries >= max_entries_) return EndPage();
    v1::TensorInfo info = registry.Describe(tensor);
    // The entry as the repeated field carries it: a tag byte, its length, the message.
    const size_t entry = info.ByteSizeLong() + 1 + 5;
    if (bytes_ + entry > max_bytes_ && entries > 0) {
      if (paged_) return EndPage();
      unsent_ = entries + 1;
      return true;
    }
    bytes_ += entry;
    *response_.add_tensors() = std::move(info);
    return true;
  }

  absl::StatusOr<v1::ListResponse> Answer(const std::string& prefix) && {
    if (unsent_ == 0) return std::move(response_);
    return absl::ResourceExhaustedError(
        absl::StrCat("list ", common::QuoteForError(prefix), ": its ", unsent_, " names take more than the ",
                     common::kMaxUnpagedListBytes, " bytes one answer may carry; list them in pages ",
                     "(ListRequest.page_size, which this client does not send: upgrade it)"));
  }

 private:
  bool EndPage() {
    response_.set_next_page_token(response_.tensors(response_.tensors_size() - 1).name());
    return false;
  }

  const bool paged_;
  const size_t max_entries_;
  const size_t max_bytes_;
  v1::ListResponse response_;
  size_t bytes_ = 0;
  size_t unsent_ = 0;  // an unpaged answer that does not fit: the names it would have held
};

}  // namespace


absl::Status Broker::NotBoundLocked(std::string_view lead, const std::string& name) const {
  std::optional<std::string> nearest = registry_.NearestBoundName(name);
  return absl::NotFoundError(absl::StrCat(common::AbslView(lead), common::QuoteForError(name),
                                          nearest ? absl::StrCat(" (did you mean ", common::QuoteForError(*nearest), "?)")
                                                  : std::string()));
}

absl::StatusOr<v1::AcquireResponse> Broker::GrantWithinCapLocked(Session& session, Tensor& tensor, bool by_name) {
  TENSORD_RETURN_IF_ERROR(CheckLeaseCapLocked(session));
  return GrantLocked(session, tensor, by_name);
}

uint64_t Broker::Acquire(uint64_t session_id, const v1::AcquireRequest& request,
                         Completion<v1::AcquireResponse> done) {
  return AcquireHere(session_id, request, std::move(done), /*may_fetch=*/true);
}

void Broker::ShareNamesThrough(RemoteNames* remote) {
  absl::MutexLock lock(&mu_);
  remote_ = remote;
}

Broker::Want Broker::Wants(const std::string& name, uint64_t except_session) {
  absl::MutexLock lock(&mu_);
  Want want = Want::kNothing;
  for (uint64_t id : waiters_.Ids()) {
    const Waiter* waiter = waiters_.Find(id);
    if (waiter == nullptr) continue;
    if (waiter->kind == Waiter::Kind::kTake &&
        (waiter->target == name || (waiter->target.ends_with('/') && common::NameHasPrefix(name, waiter->target)))) {
      return Want::kTake;
    }
    if (waiter->kind == Waiter::Kind::kAcquireName && waiter->target == name) want = Want::kReplica;
  }
  if (want == Want::kNothing && watchers_.Watches(name, except_session, access_)) want = Want::kReplica;
  return want;
}

bool Broker::FetchesLocked(const std::string& name) const {
  return remote_ != nullptr && remote_->Shares(name) && registry_.names().count(name) == 0;
}

uint64_t Broker::AcquireHere(uint64_t session_id, const v1::AcquireRequest& request,
                             Completion<v1::AcquireResponse> done, bool may_fetch) {
  if (request.target_case() == v1::AcquireRequest::kHandOver) {
    std::move(done)(RedeemHandOver(session_id, request.hand_over()));  // at once: nothing to wait for
    return 0;
  }
  absl::StatusOr<Waiter> waiter = AcquireWaiter(request);
  if (!waiter.ok()) {
    std::move(done)(waiter.status());
    return 0;
  }
  const bool by_name = waiter->kind == Waiter::Kind::kAcquireName;
  std::optional<absl::StatusOr<v1::AcquireResponse>> result;  // empty: wait
  RemoteNames* fetch_from = nullptr;  // set: the name is fetched from the cluster
  uint64_t wait_id = 0;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> session = SessionLocked(session_id);
    if (!session.ok()) {
      result = session.status();
    } else {
      const bool may_wait = AsksToWait(request);
      result = by_name ? AcquireByNameLocked(**session, *waiter, may_wait)
                       : AcquireByIdLocked(**session, *waiter, may_wait);
    }
    // Only an acquire that may read the name and found it unbound goes to the cluster.
    const bool unbound = !result || (!result->ok() && result->status().code() == absl::StatusCode::kNotFound);
    if (may_fetch && by_name && unbound && FetchesLocked(request.name())) fetch_from = remote_;
    if (!result) {
      std::optional<uint64_t> timeout;  // nullopt: forever
      if (!request.has_forever()) timeout = request.timeout_ms();
      absl::StatusOr<uint64_t> started = StartWaitLocked(**session, *std::move(waiter), done, timeout, "acquire");
      if (started.ok()) {
        wait_id = *started;
      } else {
        result = started.status();
        fetch_from = nullptr;
      }
    }
  }
  if (fetch_from != nullptr && wait_id != 0) {
    // The replica's bind grants the wait; a fetch that fails for another reason than
    // absence ends it (a remote publish later is fetched for it: IsAwaited).
    fetch_from->Fetch(request.name(), [this, wait_id](absl::Status fetched) {
      if (!fetched.ok() && fetched.code() != absl::StatusCode::kNotFound) CompleteWaitWith(wait_id, std::move(fetched));
    });
    return wait_id;
  }
  if (wait_id != 0) return wait_id;
  if (fetch_from != nullptr) {
    fetch_from->Fetch(request.name(), [this, session_id, request, done = std::move(done)](absl::Status fetched) mutable {
      if (!fetched.ok()) {
        std::move(done)(std::move(fetched));  // moved: the status is released where it is used
      } else {
        AcquireHere(session_id, request, std::move(done), /*may_fetch=*/false);
      }
    });
    return 0;
  }
  std::move(done)(std::move(*result));
  return 0;
}

std::optional<absl::StatusOr<v1::AcquireResponse>> Broker::AcquireByNameLocked(Session& session,
                                                                                const Waiter& waiter,
                                                                                bool may_wait) {
  TENSORD_RETURN_IF_ERROR(access_.CheckAccess(session.creds, common::NamespaceOf(waiter.target), false));
  Tensor* tensor = registry_.FindByName(waiter.target);
  if (tensor != nullptr && tensor->generation >= waiter.min_generation) {
    return GrantWithinCapLocked(session, *tensor, /*by_name=*/true);
  }
  if (may_wait) return std::nullopt;
  if (tensor == nullptr) return NotBoundLocked("no tensor is bound to ", waiter.target);
  return absl::NotFoundError(absl::StrCat(common::QuoteForError(waiter.target), " is at generation ",
                                          tensor->generation, ", below the ", waiter.min_generation, " asked for"));
}

std::optional<absl::StatusOr<v1::AcquireResponse>> Broker::AcquireByIdLocked(Session& session, const Waiter& waiter,
                                                                              bool may_wait) {
  // An id names no namespace, so the answer is the same for a tensor that does not exist
  // and one the caller may not read. A wait by id is for a tensor being created that the
  // caller may read (its publish may still move it out of reach: checked at the grant);
  // a wait for an id that does not exist could only ever be granted someone else's.
  Tensor* tensor = registry_.Find(waiter.tensor_id);
  if (tensor == nullptr || !access_.MayReadIn(session.creds, tensor->ns, tensor->producer_uid)) {
    return absl::NotFoundError(absl::StrCat("no tensor with id ", waiter.tensor_id, " exists that uid ",
                                            session.creds.uid, " may read"));
  }
  TENSORD_RETURN_IF_ERROR(CheckMemoryLiveLocked(*tensor));
  if (tensor->state != v1::TENSOR_STATE_CREATING) return GrantWithinCapLocked(session, *tensor);
  if (may_wait) return std::nullopt;
  return absl::NotFoundError(absl::StrCat("tensor ", waiter.tensor_id, " is not published yet"));
}

absl::StatusOr<v1::ListResponse> Broker::List(uint64_t session_id, const v1::ListRequest& request) {
  TENSORD_RETURN_IF_ERROR(ValidateList(request));
  const std::string& prefix = request.prefix();
  const std::string& token = request.page_token();
  ListPage page(request);
  absl::MutexLock lock(&mu_);
  TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
  const auto& names = registry_.names();
  // Names are unique and ordered, so resuming after the token never repeats one.
  auto it = token.empty() ? names.lower_bound(prefix) : names.upper_bound(token);
  for (; it != names.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    if (!common::NameHasPrefix(it->first, prefix)) continue;
    if (!access_.MayRead(session->creds, common::NamespaceOf(it->first))) continue;
    const Tensor* tensor = registry_.Find(it->second);
    if (tensor != nullptr && !page.Offer(registry_, *tensor)) break;
  }
  return std::move(page).Answer(prefix);
}

absl::StatusOr<v1::StatResponse> Broker::Stat(uint64_t session_id, const v1::StatRequest& request) {
  if (request.target_case() == v1::StatRequest::kName) {
    TENSORD_RETURN_IF_ERROR(common::ValidateName(request.name()));
  } else if (request.target_case() != v1::StatRequest::kTensorId) {
    return absl::InvalidArgumentError("stat: give a name or a tensor_id");
  }
  absl::MutexLock lock(&mu_);
  TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
  // The same answer whether a tensor exists or not, where the caller may not read it: a
  // name's namespace is checked before the name is looked up, and an id that names a tensor
  // out of reach is answered as one that names none.
  Tensor* tensor = nullptr;
  if (request.target_case() == v1::StatRequest::kName) {
    TENSORD_RETURN_IF_ERROR(access_.CheckAccess(session->creds, common::NamespaceOf(request.name()), false));
    tensor = registry_.FindByName(request.name());
    if (tensor == nullptr) {
      return NotBoundLocked("no tensor is bound to ", request.name());
    }
  } else {
    tensor = registry_.Find(request.tensor_id());
    if (tensor == nullptr || !access_.MayReadIn(session->creds, tensor->ns, tensor->producer_uid)) {
      return absl::NotFoundError(absl::StrCat("no tensor with id ", request.tensor_id(), " exists that uid ",
                                              session->creds.uid, " may read"));
    }
  }
  v1::StatResponse response;
  *response.mutable_tensor() = registry_.Describe(*tensor);
  for (const auto& [holder_id, count] : tensor->holders) {
    const Session* holder = sessions_.Find(holder_id);
    if (holder == nullptr) continue;
    v1::LeaseHolder* out = response.add_holders();
    out->set_session_id(holder_id);
    out->set_pid(static_cast<uint32_t>(holder->creds.pid));
    out->set_uid(holder->creds.uid);
    out->set_gid(holder->creds.gid);
    out->set_leases(count);
    out->set_producer(holder_id == tensor->producer_session);
  }
  return response;
}

void Broker::Shutdown() {
  std::vector<uint64_t> pending;
  std::vector<Completion<v1::AllocateResponse>> slot_waits;
  std::vector<uint64_t> slot_timers;
  std::vector<std::shared_ptr<WatchSink>> watch_sinks;
  std::vector<std::shared_ptr<PushSink>> push_sinks;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    pending = waiters_.Ids();
    for (SlotWaiter& waiter : queue_slots_.RemoveAll()) {
      slot_timers.push_back(waiter.timer_id);
      ForgetSlotWaiterLocked(waiter);
      slot_waits.push_back(std::move(waiter.done));
    }
    for (Watcher& watcher : watchers_.RemoveAll()) {
      watch_sinks.push_back(std::move(watcher.sink));
      ReleaseWatcherLocked(watcher);
    }
    for (const auto& [id, session] : sessions_.sessions()) {
      if (session.sink != nullptr) push_sinks.push_back(session.sink);
    }
  }
  spdlog::debug("shutdown: closing {} session streams and {} watchers, cancelling {} waits",
                push_sinks.size(), watch_sinks.size(), pending.size());
  for (auto& sink : watch_sinks) sink->Close();
  for (auto& sink : push_sinks) sink->Close();
  for (uint64_t id : pending) {
    CompleteWaitWith(id, absl::CancelledError("tensord is shutting down"));
  }
  for (uint64_t timer : slot_timers) timers_.Cancel(timer);
  for (auto& done : slot_waits) std::move(done)(absl::CancelledError("tensord is shutting down"));
}

}  // namespace tensord::server
