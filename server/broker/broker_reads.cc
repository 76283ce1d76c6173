// The Broker's reads: acquire, the waits of acquires and takes, list, stat, status and
// watchers. Take, Delete and Release, which change what is held, have their own files.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/memory/device_names.h"
#include "common/names.h"
#include "common/protocol_limits.h"
#include "common/status.h"
#include "server/broker/broker.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

constexpr size_t kMaxWatchers = 4096;
// One page of a watcher's initial bindings (SendInitialBindings).
constexpr size_t kInitialBindingsPageEvents = 256;
constexpr size_t kInitialBindingsPageBytes = 256 * 1024;

template <typename Request>
bool AsksToWaitImpl(const Request& request) {
  return request.wait_case() != Request::WAIT_NOT_SET &&
         (request.has_forever() ? request.forever() : request.timeout_ms() > 0);
}

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

bool AsksToWait(const v1::AcquireRequest& request) { return AsksToWaitImpl(request); }
bool AsksToWait(const v1::TakeRequest& request) { return AsksToWaitImpl(request); }

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

uint64_t Broker::Acquire(uint64_t session_id, const v1::AcquireRequest& request,
                         Completion<v1::AcquireResponse> done) {
  if (request.target_case() == v1::AcquireRequest::kHandOver) {
    std::move(done)(RedeemHandOver(session_id, request.hand_over()));  // at once: nothing to wait for
    return 0;
  }
  absl::StatusOr<Waiter> waiter = AcquireWaiter(request);
  if (!waiter.ok()) {
    std::move(done)(waiter.status());
    return 0;
  }
  std::optional<absl::StatusOr<v1::AcquireResponse>> result;  // empty: wait
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> session = SessionLocked(session_id);
    if (!session.ok()) {
      result = session.status();
    } else {
      const bool may_wait = AsksToWait(request);
      result = waiter->kind == Waiter::Kind::kAcquireName ? AcquireByNameLocked(**session, *waiter, may_wait)
                                                          : AcquireByIdLocked(**session, *waiter, may_wait);
    }
    if (!result) {
      std::optional<uint64_t> timeout;  // nullopt: forever
      if (!request.has_forever()) timeout = request.timeout_ms();
      absl::StatusOr<uint64_t> wait_id = StartWaitLocked(**session, *std::move(waiter), done, timeout, "acquire");
      if (wait_id.ok()) return *wait_id;
      result = wait_id.status();
    }
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
  CompleteWaitWith(wait_id, absl::CancelledError("the wait was cancelled"));
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

v1::StatusResponse Broker::GetStatus(const v1::StatusRequest& request, uint64_t session_id) {
  v1::StatusResponse response;
  response.set_version(options_.version);
  response.set_instance_nonce(instance_nonce_);
  response.set_pid(static_cast<uint32_t>(getpid()));
  response.set_uid(static_cast<uint32_t>(getuid()));
  response.set_socket(options_.socket);
  auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  response.set_uptime_ms(now - started_unix_ms_);
  absl::MutexLock lock(&mu_);
  response.set_host_bytes_in_use(memory_quota_.InUse(MemoryQuota::kHost));
  response.set_host_bytes_limit(memory_quota_.Limit(MemoryQuota::kHost));
  response.set_tensors(registry_.tensors().size());
  response.set_named_tensors(registry_.names().size());
  response.set_buffers(registry_.buffer_count());
  response.set_leases(leases_.size());
  response.set_sessions(sessions_.size());
  response.set_releases_not_found(releases_not_found_);
  response.set_host_bytes_pooled(pool_.bytes_on(&backends_->host()));
  response.set_pooled_buffers(pool_.size());
  response.set_hand_overs_pending(hand_overs_.size());
  response.set_leases_reclaimed(leases_reclaimed_);
  if (request.include_sessions()) DescribeSessionsLocked(session_id, response);
  if (request.include_namespaces()) DescribeNamespacesLocked(session_id, response);
  DescribeHandOversLocked(session_id, response);
  for (v1::BackendStatus& backend : backends_->Describe()) {
    for (v1::DeviceUsage& usage : *backend.mutable_devices()) {
      const std::string key = common::DeviceKey(usage.device());
      usage.set_bytes_in_use(memory_quota_.InUse(key));
      usage.set_bytes_limit(memory_quota_.Limit(key));
      if (absl::StatusOr<const ResolvedDevice*> device = backends_->Resolve(usage.device()); device.ok()) {
        usage.set_bytes_pooled(pool_.bytes_on(*device));
      }
    }
    *response.add_backends() = std::move(backend);
  }
  return response;
}

bool Broker::StatusScopeLocked(uint64_t session_id, std::optional<uid_t>& only_uid) {
  only_uid.reset();
  if (session_id == 0) return true;
  const Session* caller = sessions_.Find(session_id);
  if (caller == nullptr) return false;
  const uid_t uid = caller->creds.uid;
  if (uid != 0 && uid != options_.daemon_uid) only_uid = uid;
  return true;
}

void Broker::DescribeSessionsLocked(uint64_t session_id, v1::StatusResponse& response) {
  std::optional<uid_t> only_uid;  // nullopt: every session
  if (!StatusScopeLocked(session_id, only_uid)) return;
  // Running figures (UsageCounters): the cost is the sessions', whatever the tensor count.
  for (const auto& [id, session] : sessions_.sessions()) {
    if (only_uid && session.creds.uid != *only_uid) continue;
    v1::SessionUsage& usage = *response.add_session_usage();
    usage.set_id(id);
    usage.set_pid(static_cast<uint32_t>(session.creds.pid));
    usage.set_uid(session.creds.uid);
    usage.set_gid(session.creds.gid);
    usage.set_client_name(session.client_name);
    usage.set_opened_unix_ms(session.opened_unix_ms);
    usage.set_leases(leases_.CountOf(session.id));
    // A tensor leased twice holds its bytes once.
    const UsageCounters::SessionFigures figures = registry_.usage().ForSession(id);
    usage.set_bytes_leased(figures.bytes_leased);
    usage.set_tensors_produced(figures.tensors_produced);
    usage.set_bytes_produced(figures.bytes_produced);
    usage.set_leases_granted(session.leases_granted);
    usage.set_publishes(session.publishes);
    usage.set_waiting(session.waits);
  }
}

void Broker::DescribeNamespacesLocked(uint64_t session_id, v1::StatusResponse& response) {
  // A caller learns of a namespace only what List and Watch would show it: that it exists,
  // and its tensors' count and bytes, only where it may read.
  const common::PeerCredentials* caller = nullptr;
  if (session_id != 0) {
    const Session* session = sessions_.Find(session_id);
    if (session == nullptr) return;
    caller = &session->creds;
  }
  // Running figures (UsageCounters): the cost is the namespaces', whatever the tensor count.
  std::map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> usage;  // sorted output
  for (const auto& [key, figures] : registry_.usage().namespaces()) {
    if (caller != nullptr && !access_.MayReadIn(*caller, key.ns, key.producer_uid)) continue;
    auto& [tensors, bytes] = usage[{key.ns, key.device == nullptr ? std::string("host") : key.device->key}];
    tensors += figures.tensors;
    bytes += figures.bytes;
  }
  for (const auto& [key, value] : usage) {
    v1::NamespaceUsage& entry = *response.add_namespace_usage();
    entry.set_namespace_(key.first);
    entry.set_device(key.second);
    entry.set_tensors(value.first);
    entry.set_bytes(value.second);
  }
}

absl::StatusOr<uint64_t> Broker::AddWatcher(uint64_t session_id, const v1::WatchRequest& request,
                                            std::shared_ptr<WatchSink> sink) {
  TENSORD_RETURN_IF_ERROR(common::ValidatePrefix(request.prefix()));
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
    // Shutdown closed every watcher it knew of; a later one would keep the server waiting.
    if (shutting_down_) return absl::UnavailableError("tensord is shutting down");
    if (watchers_.size() >= kMaxWatchers) {
      return absl::ResourceExhaustedError(absl::StrCat("tensord already has ", watchers_.size(),
                                                       " watchers, the limit: close some first"));
    }
    const uid_t uid = session->creds.uid;
    const uint64_t metadata = kWatcherEntryBytes + request.prefix().size();
    TENSORD_RETURN_IF_ERROR(uid_quota_.Reserve(uid, UidResource::kWatchers, 1, "watching"));
    if (absl::Status charged = uid_quota_.Reserve(uid, UidResource::kMetadataBytes, metadata, "watching");
        !charged.ok()) {
      uid_quota_.Release(uid, UidResource::kWatchers, 1);
      return charged;
    }
    Watcher watcher{session_id, request.prefix(), session->creds, sink, metadata};
    watcher.initial_pending = request.initial();
    id = watchers_.Add(std::move(watcher));
  }
  return id;
}

bool Broker::SendInitialBindings(uint64_t watcher_id) {
  absl::MutexLock lock(&mu_);
  Watcher* watcher = watchers_.Find(watcher_id);
  if (watcher == nullptr || !watcher->initial_pending) return false;
  const std::string& prefix = watcher->prefix;
  const auto& names = registry_.names();
  auto it = watcher->initial_sent_through.empty() ? names.lower_bound(prefix)
                                                  : names.upper_bound(watcher->initial_sent_through);
  size_t events = 0;
  size_t bytes = 0;
  for (; it != names.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    if (events >= kInitialBindingsPageEvents || bytes >= kInitialBindingsPageBytes) return true;
    if (!common::NameHasPrefix(it->first, prefix)) continue;
    if (!access_.MayRead(watcher->creds, common::NamespaceOf(it->first))) continue;
    Tensor* tensor = registry_.Find(it->second);
    if (tensor == nullptr) continue;
    v1::WatchEvent event;
    event.set_kind(v1::WatchEvent::KIND_BOUND);
    event.set_name(it->first);
    event.set_generation(tensor->generation);
    *event.mutable_tensor() = registry_.Describe(*tensor);
    ++events;
    bytes += event.ByteSizeLong();
    watcher->sink->Push(event);
    watcher->initial_sent_through = it->first;
  }
  watcher->initial_pending = false;
  return false;
}

void Broker::ReleaseWatcherLocked(const Watcher& watcher) {
  uid_quota_.Release(watcher.creds.uid, UidResource::kWatchers, 1);
  uid_quota_.Release(watcher.creds.uid, UidResource::kMetadataBytes, watcher.metadata_bytes);
}

void Broker::RemoveWatcher(uint64_t watcher_id) {
  std::optional<Watcher> watcher;  // its sink is released outside the lock
  absl::MutexLock lock(&mu_);
  watcher = watchers_.Remove(watcher_id);
  if (watcher) ReleaseWatcherLocked(*watcher);
}

void Broker::Shutdown() {
  std::vector<uint64_t> pending;
  std::vector<std::shared_ptr<WatchSink>> watch_sinks;
  std::vector<std::shared_ptr<PushSink>> push_sinks;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    pending = waiters_.Ids();
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
}

}  // namespace tensord::server
