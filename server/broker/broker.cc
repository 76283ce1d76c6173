#include "server/broker/broker.h"

#include <sys/random.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <span>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/memory/device_names.h"
#include "common/memory/host/memfd.h"
#include "common/names.h"
#include "common/protocol_limits.h"
#include "common/status.h"
#include "common/tensor_desc.h"
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

// Tags are kept in the daemon for the tensor's life: bounded per entry and in all.
template <typename TagMap>
absl::Status ValidateTags(const TagMap& tags) {
  if (tags.size() > common::kMaxTags) {
    return absl::InvalidArgumentError(absl::StrCat("tags: ", tags.size(), " entries, at most ", common::kMaxTags));
  }
  size_t total = 0;
  for (const auto& [key, value] : tags) {
    if (key.empty() || key.size() > common::kMaxTagKeyBytes || value.size() > common::kMaxTagValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat("tags: keys 1..", common::kMaxTagKeyBytes,
                                                     " bytes, values at most ", common::kMaxTagValueBytes, " bytes"));
    }
    total += key.size() + value.size();
  }
  if (total > common::kMaxTagBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tags: ", total, " bytes of keys and values, at most ",
                                                   common::kMaxTagBytes, " in all"));
  }
  return absl::OkStatus();
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
      pool_(options_.recycle) {
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
  {
    absl::MutexLock lock(&mu_);
    std::optional<Session> session = sessions_.Close(session_id);
    if (!session) return;
    uid_quota_.Release(session->creds.uid, UidResource::kSessions, 1);
    // Before its leases go: a tensor its own lease still holds is retired, not just dropped.
    RetireProducerMemoryLocked(*session, effects);
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
    for (const Watcher& watcher : watchers_.RemoveSession(session_id)) ReleaseWatcherLocked(watcher);
    // Tensors this session was still creating die with it: their only hold was its lease.
    ReleaseArenasLocked(*session, effects);
    // Nobody maps its pooled buffers writable any more.
    FreeRecycledLocked(pool_.RemoveSession(session_id), effects);
  }
  spdlog::debug("session {} closed: {} leases released", session_id, released);
  Deliver(effects);
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
    Buffer* buffer = registry_.FindBuffer(buffer_id);
    bool held = false;
    if (buffer != nullptr) {
      // O(tensors in the buffer), once per buffer and client: clients keep arena fds.
      for (uint64_t tensor_id : buffer->tensor_ids) {
        Tensor* tensor = registry_.Find(tensor_id);
        if (tensor != nullptr && tensor->holders.contains(session->id)) {
          held = true;
          break;
        }
      }
    }
    // The same answer whether the buffer is absent or someone else's: no probing.
    if (!held) {
      return absl::NotFoundError(absl::StrCat("buffer ", buffer_id, " is not held by session ",
                                              session->id, ": acquire a tensor in it first"));
    }
    // A lease taken before its producer exited does not make the memory come back.
    if (!buffer->producer_exited.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("buffer ", buffer_id, ": ", buffer->producer_exited));
    }
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
  if (reserved.ok() || pool_.size() == 0) return reserved;
  // Idle pooled memory is never why an allocation fails.
  const uint64_t in_use = memory_quota_.InUse(device.key);
  const uint64_t limit = memory_quota_.Limit(device.key);
  const uint64_t short_by = in_use + bytes > limit ? in_use + bytes - limit : 0;
  std::vector<BufferPool::Entry> evicted = pool_.EvictOldest(&device, short_by);
  if (evicted.empty()) return reserved;
  spdlog::debug("took {} pooled buffers back for {}", evicted.size(), what);
  FreeRecycledLocked(std::move(evicted), effects);
  return memory_quota_.Reserve(device.key, bytes, what);
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

// ---------------------------------------------------------------------------------------
// Allocate, Export, Publish

void Broker::Allocate(uint64_t session_id, const v1::AllocateRequest& request,
                      Completion<v1::AllocateResponse> done) {
  auto fail = [&](absl::Status status) { std::move(done)(std::move(status)); };
  absl::StatusOr<common::TensorLayout> layout = common::ValidateDesc(request.desc());
  if (!layout.ok()) return fail(layout.status());
  absl::StatusOr<const ResolvedDevice*> device = backends_->Resolve(request.desc().device());
  if (!device.ok()) return fail(device.status());
  if (!request.ns().empty()) {
    if (absl::Status status = common::ValidateNamespace(request.ns()); !status.ok()) return fail(status);
  }
  if (absl::Status status = ValidateTags(request.tags()); !status.ok()) return fail(status);
  Tensor tensor;
  tensor.ns = request.ns();
  tensor.desc = request.desc();
  tensor.desc.clear_strides();
  // The description names the device as the broker knows it: its UUID and the daemon's
  // ordinal (each client turns the UUID into its own ordinal).
  *tensor.desc.mutable_device() = (*device)->device.device;
  tensor.device = *device;
  tensor.layout = *layout;
  tensor.tags.insert(request.tags().begin(), request.tags().end());
  tensor.created_unix_ms = NowUnixMs();
  tensor.producer_session = session_id;
  tensor.recyclable_requested = request.recyclable();
  uint64_t size = layout->extent == 0 ? 0 : (*device)->backend->RoundUp((*device)->device, layout->extent);
  // Small tensors in a namespace share arenas, carved from host memory (--arena-bytes): a
  // consumer maps an arena once.
  const bool in_arena = *device == &backends_->host() && layout->extent > 0 && !tensor.ns.empty() &&
                        !request.isolated() &&
                        options_.arena_bytes > 0 && layout->extent <= options_.arena_max_tensor_bytes &&
                        layout->extent <= options_.arena_bytes;
  std::optional<absl::StatusOr<v1::AllocateResponse>> placed;
  Effects effects;  // pooled buffers taken back for this allocation
  absl::Cleanup deliver = [&] { Deliver(effects); };  // after the mutex, on every return
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> session = SessionLocked(session_id);
    if (!session.ok()) return fail(session.status());
    if (!tensor.ns.empty()) {
      absl::Status status = access_.CheckAccess((*session)->creds, tensor.ns, true);
      if (!status.ok()) return fail(status);
    }
    if (absl::Status cap = CheckLeaseCapLocked(**session); !cap.ok()) return fail(cap);
    tensor.producer_uid = (*session)->creds.uid;
    const std::string what = absl::StrCat("allocating a ", common::DTypeName(tensor.desc.dtype()),
                                          " tensor of ", layout->nbytes, " bytes");
    const uint64_t uid_host_bytes = in_arena || *device != &backends_->host() ? 0 : access_.UidHostBytes(tensor.ns, size);
    if (absl::Status charged = ChargeTensorLocked(tensor, uid_host_bytes, what);
        !charged.ok()) {
      return fail(charged);
    }
    if (in_arena && arenas_.PlaceInArena(registry_, **session, tensor)) {
      placed = RegisterLocked(**session, std::move(tensor), nullptr, 0);
    } else if (in_arena && arenas_.Making(session_id, tensor.ns)) {
      // An arena for this namespace is being made: wait for it rather than make another.
      std::string ns = tensor.ns;
      arenas_.Enqueue(session_id, ns, QueuedAllocate{std::move(tensor), std::move(done)});
      return;
    } else if (in_arena) {
      size = arenas_.NextArenaBytes(registry_, **session, tensor.ns, ArenaSlots::SlotBytes(layout->extent));
      absl::Status reserved = ReserveArenaLocked(tensor.ns, size, effects);
      if (!reserved.ok()) {
        UnchargeTensorLocked(tensor);
        return fail(reserved);
      }
      arenas_.StartMaking(session_id, tensor.ns);
    } else if (std::optional<BufferPool::Entry> pooled =
                   request.recyclable() && size > 0
                       ? pool_.Take(session_id, tensor.ns, *device, size,
                                    std::span<const uint64_t>(request.reuse_buffer_ids().data(),
                                                              request.reuse_buffer_ids_size()))
                       : std::nullopt;
               pooled.has_value()) {
      // Memory this producer filled before and still maps: no new buffer, no round trip
      // to the executor.
      placed = RegisterRecycledLocked(**session, std::move(tensor), *std::move(pooled));
    } else if (size > 0) {
      absl::Status reserved = ReserveLocked(**device, size, what, effects);
      if (!reserved.ok()) {
        UnchargeTensorLocked(tensor);
        return fail(reserved);
      }
    }
  }
  if (placed) return std::move(done)(std::move(*placed));
  if (size == 0) {
    return FinishAllocate(session_id, 0, false, std::move(tensor),
                          std::unique_ptr<common::BackendBuffer>(), std::move(done));
  }
  PostAllocation(session_id, size, in_arena, std::move(tensor), std::move(done));
}

void Broker::PostAllocation(uint64_t session_id, uint64_t size, bool arena, Tensor tensor,
                            Completion<v1::AllocateResponse> done) {
  executor_.Post([this, session_id, size, arena, tensor = std::move(tensor),
                  done = std::move(done)]() mutable {
    const ResolvedDevice& device = *tensor.device;
    absl::StatusOr<std::unique_ptr<common::BackendBuffer>> memory = device.backend->Allocate(
        device.device, size, absl::StrCat(arena ? "tensord-arena-" : "tensord-session-", session_id));
    FinishAllocate(session_id, size, arena, std::move(tensor), std::move(memory), std::move(done));
  });
}

absl::Status Broker::ReserveArenaLocked(std::string_view ns, uint64_t bytes, Effects& effects) {
  return ReserveLocked(backends_->host(), bytes,
                       absl::StrCat("allocating a new arena for namespace ", common::QuoteForError(ns)), effects);
}

void Broker::ReleaseArenasLocked(Session& session, Effects& effects) {
  for (std::unique_ptr<common::BackendBuffer>& memory : arenas_.ReleaseArenas(registry_, session)) {
    memory_quota_.Release(MemoryQuota::kHost, memory->size());
    effects.garbage.push_back(std::move(memory));
  }
}

void Broker::FinishAllocate(uint64_t session_id, uint64_t size, bool arena, Tensor tensor,
                            absl::StatusOr<std::unique_ptr<common::BackendBuffer>> memory,
                            Completion<v1::AllocateResponse> done) {
  std::vector<std::pair<Completion<v1::AllocateResponse>, absl::StatusOr<v1::AllocateResponse>>> results;
  std::optional<QueuedAllocate> next_arena;  // overflow that needs yet another arena
  uint64_t next_arena_bytes = 0;
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    // The first tensor and whatever queued behind the arena it waited for, in order.
    std::vector<QueuedAllocate> batch;
    std::string ns = tensor.ns;
    batch.push_back(QueuedAllocate{std::move(tensor), std::move(done)});
    if (arena) {
      for (QueuedAllocate& entry : arenas_.FinishMaking(session_id, ns)) batch.push_back(std::move(entry));
    }
    Session* session = sessions_.Find(session_id);
    absl::Status failed = session == nullptr ? absl::CancelledError("the session closed during Allocate")
                                             : memory.status();
    const std::string& device_key = batch[0].tensor.device->key;
    if (failed.code() == absl::StatusCode::kResourceExhausted && pool_.size() > 0) {
      // The node itself is short of memory (the quota had room): every idle pooled buffer
      // on the device goes, so that a retry finds the memory once their producers unmapped.
      std::vector<BufferPool::Entry> evicted =
          pool_.EvictOldest(batch[0].tensor.device, std::numeric_limits<uint64_t>::max());
      if (!evicted.empty()) {
        failed = absl::ResourceExhaustedError(absl::StrCat(
            failed.message(), " (", evicted.size(), " idle recycled buffers were given back: try again)"));
        FreeRecycledLocked(std::move(evicted), effects);
      }
    }
    if (!failed.ok()) {
      memory_quota_.Release(device_key, size);
      for (QueuedAllocate& entry : batch) {
        UnchargeTensorLocked(entry.tensor);
        results.emplace_back(std::move(entry.done), failed);
      }
    } else if (!arena) {
      // Other calls of the session may have taken the last lease under the cap meanwhile.
      absl::Status cap = CheckLeaseCapLocked(*session);
      if (!cap.ok()) {
        memory_quota_.Release(device_key, size);
        UnchargeTensorLocked(batch[0].tensor);
        if (*memory != nullptr) effects.garbage.push_back(std::move(*memory));
        results.emplace_back(std::move(batch[0].done), cap);
      } else {
        results.emplace_back(std::move(batch[0].done),
                             RegisterLocked(*session, std::move(batch[0].tensor), std::move(*memory), size));
      }
    } else {
      const uint64_t arena_id = arenas_.AddArena(registry_, *session, ns, size, std::move(*memory));
      registry_.FindBuffer(arena_id)->device = &backends_->host();
      std::vector<QueuedAllocate> overflow;
      for (QueuedAllocate& entry : batch) {
        if (absl::Status cap = CheckLeaseCapLocked(*session); !cap.ok()) {
          UnchargeTensorLocked(entry.tensor);
          results.emplace_back(std::move(entry.done), cap);
        } else if (arenas_.PlaceInArena(registry_, *session, entry.tensor)) {
          results.emplace_back(std::move(entry.done), RegisterLocked(*session, std::move(entry.tensor), nullptr, 0));
        } else {
          overflow.push_back(std::move(entry));
        }
      }
      // The new arena is full: the first that did not fit makes the next, the rest wait for it.
      if (!overflow.empty()) {
        next_arena_bytes =
            arenas_.NextArenaBytes(registry_, *session, ns, ArenaSlots::SlotBytes(overflow[0].tensor.layout.extent));
        absl::Status reserved = ReserveArenaLocked(ns, next_arena_bytes, effects);
        if (!reserved.ok()) {
          for (QueuedAllocate& entry : overflow) {
            UnchargeTensorLocked(entry.tensor);
            results.emplace_back(std::move(entry.done), reserved);
          }
        } else {
          next_arena = std::move(overflow[0]);
          arenas_.StartMaking(session_id, ns);
          for (size_t k = 1; k < overflow.size(); ++k) arenas_.Enqueue(session_id, ns, std::move(overflow[k]));
        }
      }
    }
  }
  Deliver(effects);
  for (auto& [completion, result] : results) std::move(completion)(std::move(result));
  if (next_arena) {
    PostAllocation(session_id, next_arena_bytes, true, std::move(next_arena->tensor),
                   std::move(next_arena->done));
  }
}

v1::AllocateResponse Broker::RegisterLocked(Session& session, Tensor tensor,
                                            std::unique_ptr<common::BackendBuffer> memory,
                                            uint64_t size) {
  bool recyclable = false;
  if (memory != nullptr) {
    Buffer buffer;
    buffer.id = registry_.NextBufferId();
    buffer.size = size;
    // Recycled only within one namespace (a reader who kept its fd sees later tensors),
    // for a producer that keeps its writable mapping.
    recyclable = tensor.recyclable_requested && pool_.enabled() && !tensor.ns.empty() && memory->Recyclable();
    buffer.recyclable = recyclable;
    buffer.memory = std::move(memory);
    buffer.device = tensor.device;
    tensor.buffer_id = buffer.id;
    registry_.AddBuffer(std::move(buffer));
  }
  tensor.id = registry_.NextTensorId();
  v1::AcquireResponse granted = GrantLocked(session, registry_.AddTensor(std::move(tensor)));
  v1::AllocateResponse response;
  response.set_lease_id(granted.lease_id());
  *response.mutable_tensor() = std::move(*granted.mutable_tensor());
  response.set_recyclable(recyclable);
  return response;
}

v1::AllocateResponse Broker::RegisterRecycledLocked(Session& session, Tensor tensor, BufferPool::Entry entry) {
  Buffer buffer;
  buffer.id = entry.buffer_id;
  buffer.size = entry.size;
  buffer.memory = std::move(entry.memory);
  buffer.device = entry.device;
  buffer.reader_sealed = entry.reader_sealed;  // seals stay on the memfd
  buffer.readers = std::move(entry.readers);   // and readers keep their mappings
  buffer.recyclable = true;
  tensor.buffer_id = buffer.id;
  registry_.AddBuffer(std::move(buffer));
  v1::AllocateResponse response = RegisterLocked(session, std::move(tensor), nullptr, 0);
  response.set_recyclable(true);
  return response;
}

absl::StatusOr<v1::AllocateResponse> Broker::Export(uint64_t session_id, const v1::ExportRequest& request) {
  TENSORD_ASSIGN_OR_RETURN(common::TensorLayout layout, common::ValidateDesc(request.desc()));
  TENSORD_ASSIGN_OR_RETURN(const ResolvedDevice* device, backends_->Resolve(request.desc().device()));
  if (!request.ns().empty()) TENSORD_RETURN_IF_ERROR(common::ValidateNamespace(request.ns()));
  TENSORD_RETURN_IF_ERROR(ValidateTags(request.tags()));
  // What the producer sent: a staged fd (host memory), or handle bytes (a device).
  common::MemoryHandle handle;
  handle.data = request.handle_data();
  if (request.staged_fd_id() != 0 || handle.data.empty()) {
    absl::MutexLock lock(&mu_);
    TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
    TENSORD_RETURN_IF_ERROR(CheckLeaseCapLocked(*session));
    auto staged = session->staged_fds.find(request.staged_fd_id());
    if (staged == session->staged_fds.end()) {
      return absl::NotFoundError(absl::StrCat("export: staged fd ", request.staged_fd_id(),
                                              " is not staged by this session"));
    }
    handle.fds.push_back(std::move(staged->second));
    session->staged_fds.erase(staged);
  }
  const std::string what = absl::StrCat("exported ", std::string(device->backend->name()), " memory");
  // Adopting checks what the producer sent (host: seals the memfd); it may block.
  TENSORD_ASSIGN_OR_RETURN(std::unique_ptr<common::BackendBuffer> memory,
                           device->backend->Adopt(device->device, std::move(handle), request.size(), what));
  const uint64_t size = memory->size();
  v1::BufferRef ref;
  ref.set_size(size);
  ref.set_offset(request.offset());
  TENSORD_RETURN_IF_ERROR(common::ValidateFitsBuffer(layout, ref, "exported tensor"));
  if (size == 0) return absl::InvalidArgumentError(absl::StrCat("export: the ", what, " is empty"));
  Effects effects;  // pooled buffers taken back for this export
  absl::Cleanup deliver = [&] { Deliver(effects); };  // after the mutex, on every return
  {
    absl::MutexLock lock(&mu_);
    TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
    if (!request.ns().empty()) TENSORD_RETURN_IF_ERROR(access_.CheckAccess(session->creds, request.ns(), true));
    TENSORD_RETURN_IF_ERROR(CheckLeaseCapLocked(*session));
    // The buffer's size is what the backend adopted (a memfd's own size: clients refuse an
    // fd smaller than the size the broker states), and the quota counts the same bytes.
    Tensor tensor;
    tensor.ns = request.ns();
    tensor.desc = request.desc();
    tensor.desc.clear_strides();
    *tensor.desc.mutable_device() = device->device.device;
    tensor.device = device;
    tensor.layout = layout;
    tensor.offset = request.offset();
    tensor.tags.insert(request.tags().begin(), request.tags().end());
    tensor.created_unix_ms = NowUnixMs();
    tensor.producer_session = session_id;
    tensor.producer_uid = session->creds.uid;
    const uint64_t uid_host_bytes = device == &backends_->host() ? access_.UidHostBytes(tensor.ns, size) : 0;
    TENSORD_RETURN_IF_ERROR(ChargeTensorLocked(tensor, uid_host_bytes, what));
    if (absl::Status reserved = ReserveLocked(*device, size, what, effects); !reserved.ok()) {
      UnchargeTensorLocked(tensor);
      return reserved;
    }
    const bool producer_owned = memory->OwnedByProducer();
    v1::AllocateResponse response = RegisterLocked(*session, std::move(tensor), std::move(memory), size);
    // The memory goes with this session's process: its tensors retire when it closes.
    if (producer_owned) session->producer_owned_buffers.insert(response.tensor().buffer().buffer_id());
    return response;
  }
}

absl::StatusOr<v1::PublishResponse> Broker::Publish(uint64_t session_id, const v1::PublishRequest& request) {
  const std::string& name = request.name();
  if (!name.empty()) TENSORD_RETURN_IF_ERROR(common::ValidateName(name));
  if (request.ready_fence().size() > common::kMaxReadyFenceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ready_fence: ", request.ready_fence().size(),
                                                   " bytes, more than ", common::kMaxReadyFenceBytes));
  }
  std::optional<common::TensorLayout> new_layout;
  if (request.has_desc()) {
    TENSORD_ASSIGN_OR_RETURN(new_layout, common::ValidateDesc(request.desc()));
  }
  Effects effects;
  v1::PublishResponse response;
  {
    absl::MutexLock lock(&mu_);
    TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
    TENSORD_RETURN_IF_ERROR(CheckNamesMayChangeLocked());
    Tensor* tensor = registry_.Find(request.tensor_id());
    if (tensor == nullptr || tensor->producer_session != session_id || !tensor->holders.contains(session_id)) {
      return absl::NotFoundError(absl::StrCat("tensor ", request.tensor_id(),
                                              " is not being created by this session"));
    }
    if (tensor->state != v1::TENSOR_STATE_CREATING) {
      return absl::FailedPreconditionError(absl::StrCat("tensor ", tensor->id, " is already published"));
    }
    if (new_layout) TENSORD_RETURN_IF_ERROR(CheckFitsRegionLocked(*tensor, request.desc(), *new_layout));
    std::string_view ns = name.empty() ? std::string_view(tensor->ns) : common::NamespaceOf(name);
    if (!name.empty()) {
      if (!tensor->ns.empty() && tensor->ns != ns) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor ", tensor->id, " was allocated in namespace ", common::QuoteForError(tensor->ns),
            " and cannot be published as ", common::QuoteForError(name)));
      }
      TENSORD_RETURN_IF_ERROR(access_.CheckAccess(session->creds, ns, true));
      Tensor* current = registry_.FindByName(name);
      if (request.has_if_absent() && request.if_absent() && current != nullptr) {
        return absl::AlreadyExistsError(absl::StrCat(common::QuoteForError(name), " is already bound (generation ",
                                                     current->generation, ")"));
      }
      if (request.has_if_generation()) {
        uint64_t have = current == nullptr ? 0 : current->generation;
        if (have != request.if_generation()) {
          return absl::AbortedError(absl::StrCat(common::QuoteForError(name), " is at generation ", have,
                                                 ", not ", request.if_generation()));
        }
      }
    }
    if (tensor->buffer_id != 0) {
      // The seal is what protects readers: check it before any reader can get the fd.
      Buffer* buffer = registry_.FindBuffer(tensor->buffer_id);
      TENSORD_CHECK(buffer != nullptr);
      if (!buffer->reader_sealed) {
        TENSORD_RETURN_IF_ERROR(buffer->memory->CheckShareable(absl::StrCat("buffer of tensor ", tensor->id)));
        buffer->reader_sealed = true;
      }
    }
    // Tags given at publish join those given at allocation; a key given again is replaced.
    // Merged in a copy (only when there are any), so that a refused publish changes nothing.
    std::optional<std::map<std::string, std::string>> merged_tags;
    if (!request.tags().empty()) {
      merged_tags = tensor->tags;
      for (const auto& [key, value] : request.tags()) merged_tags->insert_or_assign(key, value);
      TENSORD_RETURN_IF_ERROR(ValidateTags(*merged_tags));
    }
    // The name, the tags (and a new description) stay in the daemon.
    TENSORD_RETURN_IF_ERROR(RechargeMetadataLocked(*tensor, new_layout ? request.desc() : tensor->desc, ns, name,
                                                   merged_tags ? *merged_tags : tensor->tags));
    if (new_layout) {
      // Every check passed: from here on (reply, Stat, acquires) the new description holds.
      tensor->desc = request.desc();
      tensor->desc.clear_strides();
      *tensor->desc.mutable_device() = tensor->device->device.device;
    }
    registry_.SetNamespaceAndLayout(*tensor, std::string(ns), new_layout ? *std::move(new_layout) : tensor->layout);
    tensor->state = v1::TENSOR_STATE_SEALED;
    ++session->publishes;
    if (merged_tags) tensor->tags = *std::move(merged_tags);
    if (!request.ready_fence().empty()) {
      tensor->ready_fence = request.ready_fence();
      session->ready_fenced_tensors.insert(tensor->id);
    }
    if (name.empty()) {
      tensor->generation = registry_.NextGeneration();
    } else {
      BindLocked(*tensor, name, effects);
      if (request.ttl_ms() > 0) ScheduleTtlLocked(*tensor, request.ttl_ms());
    }
    // The reply describes the tensor as published; a waiting take may unbind it at once.
    *response.mutable_tensor() = registry_.Describe(*tensor);
    WakeWaitersLocked(*tensor, effects);
  }
  Deliver(effects);
  return response;
}

absl::Status Broker::CheckFitsRegionLocked(const Tensor& tensor, const v1::TensorDesc& desc,
                                           const common::TensorLayout& layout) {
  // Devices compare as the broker resolves them: the caller's ordinal may differ from ours.
  absl::StatusOr<const ResolvedDevice*> device = backends_->Resolve(desc.device());
  if (!device.ok() || *device != tensor.device) {
    const v1::Device& had = tensor.desc.device();
    return absl::InvalidArgumentError(absl::StrCat(
        "desc.device: tensor ", tensor.id, " was allocated on ", v1::DeviceType_Name(had.type()),
        " device ", had.index(), ", not ", v1::DeviceType_Name(desc.device().type()), " device ",
        desc.device().index()));
  }
  // The region is what the tensor was given: its arena slot, or the rest of its own buffer.
  uint64_t region = 0;
  const char* what = "its buffer";
  if (tensor.buffer_id != 0) {
    const Buffer* buffer = registry_.FindBuffer(tensor.buffer_id);
    TENSORD_CHECK(buffer != nullptr && buffer->size >= tensor.offset);
    region = tensor.slot_bytes > 0 ? tensor.slot_bytes : buffer->size - tensor.offset;
    if (tensor.slot_bytes > 0) what = "its arena slot";
  }
  if (layout.extent > region) {
    return absl::InvalidArgumentError(absl::StrCat(
        "desc: extent of ", layout.extent, " bytes does not fit the ", region,
        "-byte region tensor ", tensor.id, " was allocated (", what, ")"));
  }
  // Clients refuse a tensor of no elements that has a buffer.
  if (layout.extent == 0 && tensor.buffer_id != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "desc.shape has no elements, but tensor ", tensor.id, " has a buffer"));
  }
  return absl::OkStatus();
}

void Broker::ScheduleTtlLocked(Tensor& tensor, uint64_t ttl_ms) {
  ttl_ms = std::min(ttl_ms, common::kMaxDurationMs);
  uint64_t id = tensor.id;
  uint64_t generation = tensor.generation;
  tensor.ttl_deadline_unix_ms = NowUnixMs() + static_cast<int64_t>(ttl_ms);
  tensor.ttl_timer = timers_.Schedule(
      TimerQueue::Clock::now() + std::chrono::milliseconds(ttl_ms),
      [this, id, generation] { ExpireTtl(id, generation); });
}

void Broker::ExpireTtl(uint64_t tensor_id, uint64_t generation) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    Tensor* tensor = registry_.Find(tensor_id);
    if (tensor == nullptr || tensor->name.empty() || tensor->generation != generation) return;
    tensor->ttl_timer = 0;
    spdlog::debug("binding {} expired (TTL)", tensor->name);
    UnbindLocked(*tensor, effects);
  }
  Deliver(effects);
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
