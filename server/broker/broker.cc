#include "server/broker/broker.h"

#include <sys/random.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/memory/device_names.h"
#include "common/memory/host/memfd.h"
#include "common/names.h"
#include "common/protocol_limits.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

constexpr size_t kMaxFetchBatch = common::kMaxFdsPerMessage;

std::string NewInstanceNonce() {
  std::string nonce(16, '\0');
  // A nonce, not a secret: a short read only makes it less unique, never unsafe.
  if (getrandom(nonce.data(), nonce.size(), 0) != static_cast<ssize_t>(nonce.size())) {
    uint64_t fallback = static_cast<uint64_t>(NowUnixMs()) ^ static_cast<uint64_t>(getpid());
    nonce.replace(0, sizeof(fallback), reinterpret_cast<const char*>(&fallback), sizeof(fallback));
  }
  return nonce;
}

// The quota of one device: --max-device-bytes by UUID, by "backend:ordinal", or for all,
// else the device's own memory.
std::pair<uint64_t, std::string> DeviceLimitFor(const DeviceLimits& limits, const ResolvedDevice& device) {
  const v1::Device& d = device.device.device;
  const std::string uuid = common::FormatDeviceUuid(d.type(), d.uuid());
  const std::string ordinal = absl::StrCat(std::string(device.backend->name()), ":", d.index());
  for (const std::string& name : {uuid, ordinal}) {
    if (auto it = limits.by_device.find(name); it != limits.by_device.end()) {
      return {it->second, absl::StrCat(limits.source, " (", name, ")")};
    }
  }
  if (limits.all > 0) return {limits.all, limits.source};
  return {device.device.total_bytes, "the device's own memory"};
}

}  // namespace

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Broker::Broker(BrokerOptions options, std::unique_ptr<BackendRegistry> backends)
    : options_(std::move(options)),
      instance_nonce_(NewInstanceNonce()),
      started_unix_ms_(NowUnixMs()),
      access_(options_.acls, options_.daemon_uid),
      backends_(std::move(backends)),
      arenas_(options_.arena_bytes),
      uid_quota_(options_.uid_limits, {0, options_.daemon_uid}),
      leases_(registry_, uid_quota_),
      pool_(options_.recycle),
      placement_({options_.arena_bytes, options_.arena_max_tensor_bytes}, &backends_->host(), arenas_, pool_) {
  memory_quota_.SetLimit(MemoryQuota::kHost, options_.max_host_bytes, "--max-host-bytes");
  for (const ResolvedDevice& device : backends_->devices()) {
    if (device.key == MemoryQuota::kHost) continue;
    auto [limit, source] = DeviceLimitFor(options_.device_limits, device);
    memory_quota_.SetLimit(device.key, limit, source);
  }
}

Broker::~Broker() {
  Shutdown();
  executor_.Shutdown();
  timers_.Shutdown();
}

// ---------------------------------------------------------------------------------------
// Effects and small helpers

void Broker::Deliver(Effects& effects) {
  for (uint64_t timer : effects.cancel_timers) timers_.Cancel(timer);
  for (auto& [done, result] : effects.completions) std::move(done)(std::move(result));
  for (auto& [sink, message] : effects.pushes) sink->Push(message);
  for (auto& [sink, event] : effects.events) sink->Push(event);
  if (!effects.garbage.empty()) {
    // The last close of a large memfd returns its pages to the system: not on RPC threads.
    executor_.Post([garbage = std::move(effects.garbage)]() mutable { garbage.clear(); });
  }
  if (!effects.admitted.empty()) AllocateAdmitted(std::move(effects.admitted));
}

absl::StatusOr<Session*> Broker::SessionLocked(uint64_t session_id) {
  Session* session = sessions_.Find(session_id);
  if (session == nullptr) {
    return absl::UnauthenticatedError(absl::StrCat("session ", session_id, " is closed"));
  }
  return session;
}

// ---------------------------------------------------------------------------------------
// Sessions

absl::StatusOr<v1::Welcome> Broker::OpenSession(const common::PeerCredentials& creds,
                                                std::string client_name) {
  if (client_name.size() > 256) client_name.resize(256);
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("tensord is shutting down");
  if (sessions_.size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tensord already serves ", sessions_.size(), " sessions, the limit (--max-sessions ",
        options_.max_sessions, "): try again when other clients have disconnected"));
  }
  TENSORD_RETURN_IF_ERROR(uid_quota_.Reserve(creds.uid, UidResource::kSessions, 1, "opening a session"));
  absl::StatusOr<Session*> opened = sessions_.Open(creds, std::move(client_name));
  if (!opened.ok()) {
    uid_quota_.Release(creds.uid, UidResource::kSessions, 1);
    return opened.status();
  }
  Session* session = *opened;
  v1::Welcome welcome;
  welcome.set_protocol_version(common::kFdProtocolVersion);
  welcome.set_session_token(session->token);
  welcome.set_session_id(session->id);
  welcome.set_instance_nonce(instance_nonce_);
  welcome.set_broker_uid(static_cast<uint32_t>(getuid()));
  welcome.set_broker_pid(static_cast<uint32_t>(getpid()));
  spdlog::debug("session {} opened: pid {} uid {} ({})", session->id, creds.pid, creds.uid,
               session->client_name);
  return welcome;
}

void Broker::CloseSession(uint64_t session_id) {
  Effects effects;
  size_t released = 0;
  std::vector<Completion<v1::AllocateResponse>> slot_waits_ended;
  {
    absl::MutexLock lock(&mu_);
    std::optional<Session> session = sessions_.Close(session_id);
    if (!session) return;
    uid_quota_.Release(session->creds.uid, UidResource::kSessions, 1);
    // Before its leases go: a tensor its own lease still holds is retired, not just dropped.
    RetireProducerMemoryLocked(*session, effects);
    for (uint64_t tensor_id : session->unbound_on_exit) {
      Tensor* tensor = registry_.Find(tensor_id);
      if (tensor != nullptr && !tensor->name.empty()) UnbindLocked(*tensor, effects);
    }
    // Its ready events went with its process: later acquirers get no fence to open.
    for (uint64_t tensor_id : session->ready_fenced_tensors) {
      if (Tensor* tensor = registry_.Find(tensor_id)) tensor->ready_fence.clear();
    }
    for (uint64_t tensor_id : leases_.DropAll(*session)) {
      if (Tensor* tensor = registry_.Find(tensor_id)) MaybeRemoveLocked(*tensor, effects);
      ++released;
    }
    leases_reclaimed_ += released;
    for (Waiter& waiter : waiters_.RemoveSession(session_id)) {
      effects.cancel_timers.push_back(waiter.timer_id);
      effects.completions.emplace_back(std::move(waiter.done), absl::CancelledError("the session closed"));
      ForgetWaiterLocked(waiter);
    }
    for (SlotWaiter& waiter : queue_slots_.RemoveSession(session_id)) {
      effects.cancel_timers.push_back(waiter.timer_id);
      slot_waits_ended.push_back(std::move(waiter.done));
      ForgetSlotWaiterLocked(waiter);
      AdmitWaitersLocked(waiter.request.queue().prefix(), effects);  // it may have been first in line
    }
    for (const Watcher& watcher : watchers_.RemoveSession(session_id)) ReleaseWatcherLocked(watcher);
    // Tensors this session was still creating die with it: their only hold was its lease.
    ReleaseArenasLocked(*session, effects);
    // Nobody maps its pooled buffers writable any more.
    FreeRecycledLocked(pool_.RemoveSession(session_id), effects);
  }
  spdlog::debug("session {} closed: {} leases released", session_id, released);
  Deliver(effects);
  for (auto& done : slot_waits_ended) std::move(done)(absl::CancelledError("the session closed"));
}

void Broker::RetireProducerMemoryLocked(const Session& session, Effects& effects) {
  if (session.producer_owned_buffers.empty()) return;
  const std::string why = absl::StrCat("its producer (pid ", session.creds.pid, ", session ", session.id,
                                       ") exited; its memory was the producer's");
  for (uint64_t buffer_id : session.producer_owned_buffers) {
    Buffer* buffer = registry_.FindBuffer(buffer_id);
    TENSORD_CHECK(buffer != nullptr);  // MaybeRemoveLocked forgets a buffer it frees
    buffer->producer_exited = why;
    // Unbinding may drop a tensor, and with the last one the buffer.
    const std::vector<uint64_t> tensor_ids(buffer->tensor_ids.begin(), buffer->tensor_ids.end());
    for (uint64_t tensor_id : tensor_ids) {
      Tensor* tensor = registry_.Find(tensor_id);
      if (tensor == nullptr) continue;
      spdlog::info("tensor {} ({}) retired: {}", tensor->id,
                   tensor->name.empty() ? std::string("unnamed") : tensor->name, why);
      if (!tensor->name.empty()) {
        UnbindLocked(*tensor, effects);
      } else if (tensor->state == v1::TENSOR_STATE_SEALED) {
        tensor->state = v1::TENSOR_STATE_RETIRED;
      }
    }
  }
}

absl::Status Broker::CheckMemoryLiveLocked(const Tensor& tensor) {
  if (tensor.buffer_id == 0) return absl::OkStatus();
  const Buffer* buffer = registry_.FindBuffer(tensor.buffer_id);
  TENSORD_CHECK(buffer != nullptr);
  if (buffer->producer_exited.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("tensor ", tensor.id, ": ", buffer->producer_exited));
}

absl::StatusOr<uint64_t> Broker::Authenticate(std::string_view token,
                                               const common::PeerCredentials& peer) {
  absl::MutexLock lock(&mu_);
  Session* session = sessions_.FindByToken(token);
  if (session == nullptr) {
    return absl::UnauthenticatedError(
        "unknown or expired session token: connect on the fd channel first (metadata "
        "'tensord-session')");
  }
  if (session->creds.uid != peer.uid || session->creds.gid != peer.gid) {
    spdlog::warn("session {} (uid {} gid {}): its token was presented by uid {} gid {}; refused",
                 session->id, session->creds.uid, session->creds.gid, peer.uid, peer.gid);
    return absl::UnauthenticatedError(absl::StrCat(
        "this session token was issued to other credentials than this connection's (uid ",
        peer.uid, ", gid ", peer.gid, "): a token is valid only from the uid and gid that opened "
        "its session on the fd channel"));
  }
  return session->id;
}

absl::StatusOr<std::vector<Broker::FetchedHandle>> Broker::FetchHandles(uint64_t session_id,
                                                                        const v1::FetchFd& request) {
  if (request.buffer_ids_size() == 0 || static_cast<size_t>(request.buffer_ids_size()) > kMaxFetchBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("fetch: between 1 and ", kMaxFetchBatch, " buffer ids per message"));
  }
  absl::MutexLock lock(&mu_);
  TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
  std::vector<FetchedHandle> handles;
  size_t fds = 0;
  for (uint64_t buffer_id : request.buffer_ids()) {
    TENSORD_ASSIGN_OR_RETURN(Buffer * buffer, FetchableBufferLocked(*session, buffer_id));
    absl::StatusOr<common::MemoryHandle> handle = buffer->memory->Export();
    if (!handle.ok()) {
      return absl::Status(handle.status().code(),
                          absl::StrCat("export buffer ", buffer_id, ": ", handle.status().message()));
    }
    fds += handle->fds.size();
    if (fds > common::kMaxFdsPerMessage && !handles.empty()) break;  // the client asks again
    // Readers of a recyclable buffer keep their mapping for its next tensor: they hear
    // when it is freed (FreeRecycledLocked).
    if (buffer->recyclable && !buffer->tensor_ids.empty()) {
      const Tensor* first = registry_.Find(*buffer->tensor_ids.begin());
      if (first != nullptr && first->producer_session != session->id) buffer->readers.insert(session->id);
    }
    handles.push_back(
        FetchedHandle{buffer_id, buffer->size, buffer->device->device.device.type(), *std::move(handle)});
  }
  return handles;
}

absl::StatusOr<Buffer*> Broker::FetchableBufferLocked(const Session& session, uint64_t buffer_id) {
  Buffer* buffer = registry_.FindBuffer(buffer_id);
  bool held = false;
  if (buffer != nullptr) {
    // O(tensors in the buffer), once per buffer and client: clients keep arena fds.
    for (uint64_t tensor_id : buffer->tensor_ids) {
      Tensor* tensor = registry_.Find(tensor_id);
      if (tensor != nullptr && tensor->holders.contains(session.id)) {
        held = true;
        break;
      }
    }
  }
  // The same answer whether the buffer is absent or someone else's: no probing.
  if (!held) {
    return absl::NotFoundError(absl::StrCat("buffer ", buffer_id, " is not held by session ", session.id,
                                            ": acquire a tensor in it first"));
  }
  // A lease taken before its producer exited does not make the memory come back.
  if (!buffer->producer_exited.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("buffer ", buffer_id, ": ", buffer->producer_exited));
  }
  return buffer;
}

absl::StatusOr<v1::Staged> Broker::StageFd(uint64_t session_id, common::UniqueFd fd) {
  TENSORD_ASSIGN_OR_RETURN(uint64_t size, common::FdSize(fd.get(), "staged fd"));
  absl::MutexLock lock(&mu_);
  TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
  if (session->staged_fds.size() >= 64) {
    return absl::ResourceExhaustedError("session has 64 staged fds: export or close them first");
  }
  uint64_t id = ++session->last_staged_id;
  session->staged_fds.emplace(id, std::move(fd));
  v1::Staged staged;
  staged.set_staged_fd_id(id);
  staged.set_size(size);
  return staged;
}

absl::StatusOr<bool> Broker::AttachSink(uint64_t session_id, std::shared_ptr<PushSink> sink) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("tensord is shutting down");
  TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
  session->sink = std::move(sink);
  return std::exchange(session->reset_pending, false);
}

void Broker::DetachSink(uint64_t session_id, const PushSink* sink) {
  absl::MutexLock lock(&mu_);
  Session* session = sessions_.Find(session_id);
  if (session != nullptr && session->sink.get() == sink) {
    session->sink.reset();
    // Pushes sent while no stream is attached are lost: the next stream starts with a reset.
    session->reset_pending = true;
  }
}

// ---------------------------------------------------------------------------------------
// Leases, bindings, retirement

v1::AcquireResponse Broker::GrantLocked(Session& session, Tensor& tensor, bool by_name) {
  v1::AcquireResponse response;
  response.set_lease_id(leases_.Grant(session, tensor, by_name));
  *response.mutable_tensor() = registry_.Describe(tensor);
  response.set_ready_fence(tensor.ready_fence);
  if (!tensor.ready_fence.empty()) response.set_ready_fence_session(tensor.producer_session);
  return response;
}

void Broker::MaybeRemoveLocked(Tensor& tensor, Effects& effects) {
  if (!tensor.name.empty() || tensor.leases > 0 || tensor.hand_overs > 0) return;
  if (tensor.ttl_timer != 0) effects.cancel_timers.push_back(tensor.ttl_timer);
  LeaveQueueLocked(tensor, effects);
  UnchargeTensorLocked(tensor);
  uint64_t id = tensor.id;
  const uint64_t buffer_id = tensor.buffer_id;
  const uint64_t producer_session = tensor.producer_session;
  const ResolvedDevice* device = tensor.device;
  const bool had_ready_fence = !tensor.ready_fence.empty();
  const Buffer* buffer = buffer_id == 0 ? nullptr : registry_.FindBuffer(buffer_id);
  const bool recyclable = buffer != nullptr && buffer->recyclable;
  const bool reader_sealed = buffer != nullptr && buffer->reader_sealed;
  // The release path: copied only for a buffer that may go to the pool.
  std::string ns = recyclable ? tensor.ns : std::string();
  absl::flat_hash_set<uint64_t> readers = recyclable ? buffer->readers : absl::flat_hash_set<uint64_t>();
  std::unique_ptr<common::BackendBuffer> memory = registry_.Remove(id);
  if (memory != nullptr && recyclable) {
    const uint64_t size = memory->size();
    RecycleLocked(BufferPool::Entry{buffer_id, producer_session, std::move(ns), device, size, reader_sealed,
                                    std::move(readers), std::move(memory)},
                  effects);
  } else if (memory != nullptr) {
    // Buffer sizes are rounded by their backend, the same as what was reserved.
    memory_quota_.Release(device->key, memory->size());
    if (memory->OwnedByProducer()) ExportReleasedLocked(producer_session, id, buffer_id, effects);
    effects.garbage.push_back(std::move(memory));
  }
  if (had_ready_fence) {
    if (Session* producer = sessions_.Find(producer_session)) producer->ready_fenced_tensors.erase(id);
  }
  spdlog::trace("tensor {} dropped", id);
}

void Broker::RecycleLocked(BufferPool::Entry entry, Effects& effects) {
  // The pool is for the producer's next tensors: a closed producer has none.
  if (sessions_.Find(entry.session_id) == nullptr) {
    std::vector<BufferPool::Entry> freed;
    freed.push_back(std::move(entry));
    return FreeRecycledLocked(std::move(freed), effects);
  }
  FreeRecycledLocked(pool_.Put(std::move(entry)), effects);
}

void Broker::FreeRecycledLocked(std::vector<BufferPool::Entry> entries, Effects& effects) {
  for (BufferPool::Entry& entry : entries) {
    memory_quota_.Release(entry.device->key, entry.size);
    effects.garbage.push_back(std::move(entry.memory));
    // The producer drops its writable mapping, each reader the mapping it kept: only then is
    // the memory free (a device allocation lives while any process has it imported).
    entry.readers.insert(entry.session_id);
    for (uint64_t session_id : entry.readers) {
      Session* holder = sessions_.Find(session_id);
      if (holder == nullptr) continue;
      v1::SessionResponse push;
      push.mutable_recycled_buffer_freed()->set_buffer_id(entry.buffer_id);
      PushLocked(*holder, std::move(push), effects);
    }
  }
}

absl::Status Broker::ReserveLocked(const ResolvedDevice& device, uint64_t bytes, std::string_view what,
                                   Effects& effects) {
  absl::Status reserved = memory_quota_.Reserve(device.key, bytes, what);
  if (reserved.ok()) return reserved;
  // Neither idle pooled memory nor a copy that can be fetched again is why an allocation
  // fails.
  if (FreePooledLocked(device, bytes, what, effects)) {
    reserved = memory_quota_.Reserve(device.key, bytes, what);
    if (reserved.ok()) return reserved;
  }
  if (EvictCopiesLocked(device, bytes, what, effects)) reserved = memory_quota_.Reserve(device.key, bytes, what);
  return reserved;
}

uint64_t Broker::ShortByLocked(const ResolvedDevice& device, uint64_t bytes) const {
  const uint64_t in_use = memory_quota_.InUse(device.key);
  const uint64_t limit = memory_quota_.Limit(device.key);
  return in_use + bytes > limit ? in_use + bytes - limit : 0;
}

bool Broker::FreePooledLocked(const ResolvedDevice& device, uint64_t bytes, std::string_view what,
                              Effects& effects) {
  if (pool_.size() == 0) return false;
  std::vector<BufferPool::Entry> evicted = pool_.EvictOldest(&device, ShortByLocked(device, bytes));
  if (evicted.empty()) return false;
  spdlog::debug("took {} pooled buffers back for {}", evicted.size(), what);
  FreeRecycledLocked(std::move(evicted), effects);
  return true;
}

bool Broker::EvictCopiesLocked(const ResolvedDevice& device, uint64_t bytes, std::string_view what,
                               Effects& effects) {
  if (!CheckNamesMayChangeLocked().ok()) return false;
  std::vector<std::pair<int64_t, uint64_t>> copies;  // (created, tensor id): oldest first
  for (const auto& [id, tensor] : registry_.tensors()) {
    if (tensor.evictable && !tensor.name.empty() && tensor.leases == 0 && tensor.hand_overs == 0 &&
        tensor.device == &device) {
      copies.emplace_back(tensor.created_unix_ms, id);
    }
  }
  std::sort(copies.begin(), copies.end());
  size_t evicted = 0;
  for (const auto& [created, id] : copies) {
    if (ShortByLocked(device, bytes) == 0) break;
    Tensor* tensor = registry_.Find(id);
    if (tensor == nullptr) continue;
    spdlog::info("unbound {} ({} bytes), a copy that can be fetched again, to make room for {}", tensor->name,
                 tensor->layout.extent, what);
    UnbindLocked(*tensor, effects);  // nothing holds it: it goes now, or its buffer to a pool
    ++evicted;
    FreePooledLocked(device, bytes, what, effects);
  }
  return evicted > 0;
}

void Broker::ExportReleasedLocked(uint64_t producer_session, uint64_t tensor_id, uint64_t buffer_id,
                                  Effects& effects) {
  // A closed producer has nobody to tell (its buffers were retired when it closed).
  Session* producer = sessions_.Find(producer_session);
  if (producer == nullptr || producer->producer_owned_buffers.erase(buffer_id) == 0) return;
  v1::SessionResponse push;
  push.mutable_export_released()->set_tensor_id(tensor_id);
  push.mutable_export_released()->set_buffer_id(buffer_id);
  PushLocked(*producer, std::move(push), effects);
}

void Broker::PushLocked(Session& session, v1::SessionResponse push, Effects& effects) {
  if (session.sink != nullptr) {
    effects.pushes.emplace_back(session.sink, std::move(push));
  } else {
    session.reset_pending = true;  // lost: the next stream starts with a cache_reset
  }
}

void Broker::RetireLocked(Tensor& tensor, const std::string& old_name, Effects& effects) {
  if (tensor.state == v1::TENSOR_STATE_SEALED) tensor.state = v1::TENSOR_STATE_RETIRED;
  LeaveQueueLocked(tensor, effects);
  if (tensor.unbind_on_exit) {
    tensor.unbind_on_exit = false;
    if (Session* producer = sessions_.Find(tensor.producer_session)) producer->unbound_on_exit.erase(tensor.id);
  }
  if (tensor.ttl_timer != 0) {
    effects.cancel_timers.push_back(tensor.ttl_timer);
    tensor.ttl_timer = 0;
  }
  // Holders that acquired it by name may have cached their lease under it: tell them.
  if (tensor.name_holders.empty()) return;
  v1::SessionResponse push;
  v1::TensorRetired* retired = push.mutable_retired();
  retired->set_tensor_id(tensor.id);
  retired->set_name(old_name);
  Tensor* current = registry_.FindByName(old_name);
  retired->set_generation(current != nullptr ? current->generation : 0);
  for (uint64_t session_id : tensor.name_holders) {
    if (Session* session = sessions_.Find(session_id)) PushLocked(*session, push, effects);
  }
}

void Broker::UnbindLocked(Tensor& tensor, Effects& effects) {
  names_version_.fetch_add(1, std::memory_order_release);
  std::string old_name = tensor.name;
  registry_.Unbind(tensor);
  RetireLocked(tensor, old_name, effects);
  if (!watchers_.empty()) {
    v1::WatchEvent event;
    event.set_kind(v1::WatchEvent::KIND_UNBOUND);
    event.set_name(old_name);
    event.set_generation(tensor.generation);
    NotifyWatchersLocked(event, effects);
  }
  MaybeRemoveLocked(tensor, effects);
}

void Broker::BindLocked(Tensor& tensor, const std::string& name, Effects& effects) {
  names_version_.fetch_add(1, std::memory_order_release);
  uint64_t previous = registry_.Bind(name, tensor, registry_.NextGeneration());
  if (previous != 0) {
    Tensor* old = registry_.Find(previous);
    TENSORD_CHECK(old != nullptr);
    RetireLocked(*old, name, effects);
    MaybeRemoveLocked(*old, effects);
  }
  if (watchers_.empty()) return;  // the common case: no event to build
  v1::WatchEvent event;
  event.set_kind(v1::WatchEvent::KIND_BOUND);
  event.set_name(name);
  event.set_generation(tensor.generation);
  *event.mutable_tensor() = registry_.Describe(tensor);
  NotifyWatchersLocked(event, effects);
}

void Broker::NotifyWatchersLocked(const v1::WatchEvent& event, Effects& effects) {
  for (std::shared_ptr<WatchSink>& sink : watchers_.SinksFor(event, access_)) {
    effects.events.emplace_back(std::move(sink), event);
  }
}

bool Broker::UsageMatchesRecountForTest() {
  absl::MutexLock lock(&mu_);
  return registry_.usage() == registry_.RecountUsageForTest();
}

size_t Broker::UsageRowsForTest() {
  absl::MutexLock lock(&mu_);
  return registry_.usage().namespaces().size();
}

}  // namespace tensord::server
