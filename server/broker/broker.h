// Broker: the one handler layer behind every transport (the Session stream, the unary RPCs
// and the fd channel). It composes its parts under one mutex: the tensors (TensorRegistry),
// leases (LeaseTable), hand-overs in flight (HandOverTable), sessions (SessionManager), waits
// (WaitQueue), watchers (WatcherSet),
// arenas (ArenaAllocator), per-uid charges (UidQuota) and device memory (MemoryQuota); the
// ACLs (AccessPolicy) are constant; recycled buffers wait in the BufferPool. Work that can block (allocating memory, freeing a large
// buffer) runs on the Executor, and completions, pushes and watch events are delivered
// after the mutex is released.
//
// Rules it keeps: a tensor lives while bound, leased or handed over (a hand-over token
// neither redeemed, expired nor cancelled); closing a session releases every lease it held and
// cancels its waits, but leaves the hand-overs it made pending; a tensor in memory its producer owns
// (BackendBuffer::OwnedByProducer: legacy CUDA IPC) retires when that producer's session
// closes, since the memory may go with its process: its name is unbound, new acquires by
// id and fetches of its buffer fail, and leases already held stay until released; when the
// broker frees such a buffer (unbound, no lease left, the producer's own included) while
// its producer's session is open, that session is pushed ExportReleased, so its client may
// let the memory go (a push lost on the way makes the session's next stream start with a
// cache_reset, as for any push); every
// description is validated before anything is registered; quota failures answer
// RESOURCE_EXHAUSTED with use and limit, and only once pooled buffers on that device were
// taken back; a recyclable buffer whose tensor went stays in its producer's pool while the
// producer's session lives (its namespace and device fixed), and its producer is pushed
// RecycledBufferFreed when the broker frees it; identity is the session's SO_PEERCRED
// credentials, never a field in a request.
//
// Errors: INVALID_ARGUMENT (bad description, name), NOT_FOUND (no such name/tensor/lease),
// DEADLINE_EXCEEDED (a wait expired), ALREADY_EXISTS / ABORTED (conditional publish),
// FAILED_PRECONDITION (wrong state, missing seals, a tensor whose memory went with its
// producer: "tensor N: its producer (pid P, session S) exited; ..."),
// PERMISSION_DENIED (ACL),
// RESOURCE_EXHAUSTED (quota, memory, and the caps on sessions, leases per session, pending
// waits per session and the per-uid limits of UidQuota: the message names the cap and its
// value; nothing is made),
// UNAUTHENTICATED (unknown session token, or a token used by other credentials),
// CANCELLED (a wait was cancelled or the broker is stopping). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/fd_channel.h"
#include "common/memory/memory_backend.h"
#include "common/protocol_limits.h"
#include "server/access/access_policy.h"
#include "server/access/uid_quota.h"
#include "server/broker/remote_names.h"
#include "server/memory/backend_registry.h"
#include "server/memory/buffer_pool.h"
#include "server/memory/memory_quota.h"
#include "server/placement/arena_allocator.h"
#include "server/placement/placement.h"
#include "server/runtime/completion.h"
#include "server/runtime/executor.h"
#include "server/runtime/timer_queue.h"
#include "server/state/hand_over_table.h"
#include "server/state/lease_table.h"
#include "server/state/queue_slots.h"
#include "server/state/session_manager.h"
#include "server/state/tensor_registry.h"
#include "server/state/wait_queue.h"
#include "server/state/watcher_set.h"
#include "tensord/v1/broker.pb.h"
#include "tensord/v1/fd_channel.pb.h"
#include "tensord/v1/registry_snapshot.pb.h"

namespace tensord::server {

// Wall-clock milliseconds since the epoch: what the broker stamps and compares deadlines with.
int64_t NowUnixMs();

// Whether an acquire or take asks to wait for its tensor (a positive timeout, or forever):
// only such a request can start a wait that Broker::CancelWait ends.
bool AsksToWait(const tensord::v1::AcquireRequest& request);
bool AsksToWait(const tensord::v1::TakeRequest& request);

struct BrokerOptions {
  uint64_t max_host_bytes = 0;
  DeviceLimits device_limits;  // --max-device-bytes
  uint64_t max_sessions = kDefaultMaxSessions;
  uint64_t max_leases_per_session = kDefaultMaxLeasesPerSession;
  uint64_t max_waits_per_session = kDefaultMaxWaitsPerSession;
  // Per-uid limits (0: none); they bind every uid but root and daemon_uid.
  UidLimits uid_limits;
  uint64_t arena_bytes = 0;  // the largest arena; 0: every tensor gets its own buffer
  uint64_t arena_max_tensor_bytes = 0;
  // Recycled buffers kept per producer session (--recycle-buffers-per-session,
  // --recycle-bytes-per-session); either 0: recycling off.
  BufferPool::Limits recycle;
  uid_t daemon_uid = 0;
  std::map<std::string, NamespaceAcl> acls;
  std::string socket;
  std::string version;
};

class Broker {
 public:
  // `backends` holds the memory backends (host memory at least).
  Broker(BrokerOptions options, std::unique_ptr<BackendRegistry> backends);
  ~Broker();
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  // --- sessions (fd channel) ---
  absl::StatusOr<tensord::v1::Welcome> OpenSession(const common::PeerCredentials& creds,
                                                   std::string client_name);
  void CloseSession(uint64_t session_id);
  // The session a token names, when `peer` (the credentials of the gRPC connection the
  // token came on) has the uid and gid that opened it: a token is useless to other users.
  // UNAUTHENTICATED otherwise (the message never holds the token).
  absl::StatusOr<uint64_t> Authenticate(std::string_view token, const common::PeerCredentials& peer);
  // The handles of buffers the session holds a lease on, in the order asked; their fds are
  // dups the caller sends and closes. Fewer buffers than asked when the next one's fds
  // would take the reply past kMaxFdsPerMessage (never none).
  struct FetchedHandle {
    uint64_t buffer_id;
    uint64_t size;
    tensord::v1::DeviceType device_type;
    common::MemoryHandle handle;
  };
  absl::StatusOr<std::vector<FetchedHandle>> FetchHandles(uint64_t session_id,
                                                          const tensord::v1::FetchFd& request);
  absl::StatusOr<tensord::v1::Staged> StageFd(uint64_t session_id, common::UniqueFd fd);
  // Returns true when the session missed pushes while no stream was attached: the new
  // stream must start with a cache_reset. UNAUTHENTICATED when the session is gone,
  // UNAVAILABLE once the broker is stopping (a stream attached then would never be closed).
  absl::StatusOr<bool> AttachSink(uint64_t session_id, std::shared_ptr<PushSink> sink);
  void DetachSink(uint64_t session_id, const PushSink* sink);

  // --- Broker calls ---
  // Completes on the executor (allocation may block). With request.queue, first waits for a
  // slot of the bounded work queue while it is full (broker_queues.cc): returns that wait's
  // id for CancelWait (0 when it did not wait).
  uint64_t Allocate(uint64_t session_id, const tensord::v1::AllocateRequest& request,
                    Completion<tensord::v1::AllocateResponse> done);
  absl::StatusOr<tensord::v1::AllocateResponse> Export(uint64_t session_id,
                                                       const tensord::v1::ExportRequest& request);
  // With `desc` set (a slot allocated ahead of time, described now): validated as Allocate
  // validates, and it must fit the region the tensor was allocated; on any error nothing
  // changes.
  absl::StatusOr<tensord::v1::PublishResponse> Publish(uint64_t session_id,
                                                       const tensord::v1::PublishRequest& request);
  // `done` runs exactly once, maybe before this returns. Returns a wait id for CancelWait
  // (0 when it completed at once).
  uint64_t Acquire(uint64_t session_id, const tensord::v1::AcquireRequest& request,
                   Completion<tensord::v1::AcquireResponse> done);
  uint64_t Take(uint64_t session_id, const tensord::v1::TakeRequest& request,
                Completion<tensord::v1::AcquireResponse> done);
  // Completes a pending wait (an acquire's, a take's, or an allocation's waiting for a queue
  // slot) with CANCELLED; no-op when it already completed.
  void CancelWait(uint64_t wait_id);
  // INVALID_ARGUMENT (nothing released) for more than common::kMaxReleaseBatch ids.
  absl::StatusOr<tensord::v1::ReleaseResponse> Release(uint64_t session_id,
                                                       const tensord::v1::ReleaseRequest& request);
  // A one-time token for the tensor of `request.lease_id` (a lease this session holds on a
  // published tensor), which any session that may read the tensor redeems once for a lease
  // of its own (Acquire with AcquireRequest.hand_over), within the TTL. Until then the
  // broker holds the tensor for the token, whatever becomes of this session; an expired
  // token leaves nothing behind. NOT_FOUND (no such lease here), FAILED_PRECONDITION (not
  // published; memory gone with its producer), INVALID_ARGUMENT (a TTL over an hour),
  // RESOURCE_EXHAUSTED (the uid's pending hand-overs reach --max-leases-per-session, or its
  // metadata quota, or the host memory it would pin: see below).
  //
  // The memory a pending hand-over holds alive (its tensor's dedicated buffer, or arena
  // slot) counts against its maker's uid until it ends (redeemed, expired, cancelled): host
  // memory in UidResource::kHostBytes (--max-host-bytes-per-uid, wherever the tensor lives,
  // ACL'd namespaces included, since the maker need not be the writer), device memory in
  // the figures only (no per-uid device quota exists). Each tensor counts once per uid,
  // however many tokens the uid has pending on it; a lease never counts its memory (it
  // ends with its session's process, a token does not), so a tensor both leased and handed
  // over by one uid counts once, for the hand-over.
  absl::StatusOr<tensord::v1::HandOverResponse> HandOver(uint64_t session_id,
                                                         const tensord::v1::HandOverRequest& request);
  // Ends pending hand-overs made by `session_id`'s uid (the given tokens, or all of them),
  // as their expiry would. INVALID_ARGUMENT for more than common::kMaxCancelHandOversBatch
  // tokens (nothing cancelled).
  absl::StatusOr<tensord::v1::CancelHandOversResponse> CancelHandOvers(
      uint64_t session_id, const tensord::v1::CancelHandOversRequest& request);
  absl::StatusOr<tensord::v1::DeleteResponse> Delete(uint64_t session_id,
                                                     const tensord::v1::DeleteRequest& request);
  absl::StatusOr<tensord::v1::ListResponse> List(uint64_t session_id,
                                                 const tensord::v1::ListRequest& request);
  absl::StatusOr<tensord::v1::StatResponse> Stat(uint64_t session_id,
                                                 const tensord::v1::StatRequest& request);
  // Counts, memory and backends; with request.include_sessions the sessions `session_id`'s
  // uid may see (every one for root and the daemon's uid, else its own uid's; session 0:
  // the daemon itself, which sees all), with include_namespaces what each namespace holds.
  // Its cost grows with the namespaces and sessions, never with the tensors: the per-namespace
  // and per-session figures are running counts (TensorRegistry::usage).
  tensord::v1::StatusResponse GetStatus(const tensord::v1::StatusRequest& request = {}, uint64_t session_id = 0);
  // Whether those running figures equal a recount of every tensor and lease.
  bool UsageMatchesRecountForTest();
  // Whether every queue's slots held equal the tensors that hold one of its slots.
  bool QueueSlotsMatchTensorsForTest();
  // The namespace rows GetStatus walks (one per namespace, device and, without a namespace,
  // producer uid).
  size_t UsageRowsForTest();

  // Hand-over to a new daemon (tensord --take-over; broker_snapshot.cc).
  struct Snapshot {
    tensord::v1::RegistrySnapshot registry;
    std::vector<common::UniqueFd> fds;  // SnapshotBuffer.first_fd indexes these
    uint64_t dropped = 0;               // named tensors whose memory cannot be carried (logged)
  };
  // Freezes the names (publish, delete and take answer UNAVAILABLE: a new daemon is taking
  // over, try again there) and snapshots every bound tensor with the memory behind it.
  // Reads go on. Unfreeze() lifts the freeze when the hand-over fails.
  Snapshot FreezeAndSnapshot();
  void Unfreeze();
  // The same without the freeze, for systemd's fd store (fd_store.h): buffers in `stored`
  // come without fds (fd_count 0); every buffer names its fds (SnapshotBuffer.fd_names).
  Snapshot SnapshotForStore(const std::set<uint64_t>& stored);
  // Changes whenever a name is bound or unbound.
  uint64_t names_version() const { return names_version_.load(std::memory_order_acquire); }
  struct RestoreReport {
    uint64_t tensors = 0, buffers = 0, bytes = 0;
    uint64_t refused = 0;  // entries not taken, each logged with its reason
  };
  // Takes the bound tensors of another daemon's snapshot, before this broker serves anyone.
  // Every entry is checked (name, description, that it fits its buffer, the buffer's fd and
  // size, quotas); one that fails is refused with a logged reason and the rest go on.
  RestoreReport Restore(const tensord::v1::RegistrySnapshot& snapshot, std::vector<common::UniqueFd> fds);

  // Registers a watcher; returns its id for RemoveWatcher. With request.initial its current
  // bindings are left for SendInitialBindings to send.
  absl::StatusOr<uint64_t> AddWatcher(uint64_t session_id, const tensord::v1::WatchRequest& request,
                                      std::shared_ptr<WatchSink> sink);
  // Pushes the next page of watcher `watcher_id`'s initial bindings (BOUND events in name
  // order, at most 256 of them or 256 KiB) to its sink, under the lock so that no change
  // slips in between; changes to names past the page wait for their own page. Returns
  // whether any are left; false for a watcher that is gone or has none left.
  bool SendInitialBindings(uint64_t watcher_id);
  void RemoveWatcher(uint64_t watcher_id);

  // Cancels every wait and refuses new ones; used by SIGTERM.
  void Shutdown();

  // --- names shared with other nodes (server/cluster/) ---
  // From now on an acquire by name of a name `remote` shares that is not bound here fetches
  // it through `remote` (remote_names.h): without a wait it answers once the fetch is done;
  // a waiting acquire waits here while the fetch runs, and ends with the fetch's error
  // unless that is NOT_FOUND. nullptr: nothing is shared from then on (fetches under way
  // finish). `remote` must outlive its use: set nullptr before destroying it.
  void ShareNamesThrough(RemoteNames* remote);
  // A take of a shared name or prefix that finds nothing here moves one from another node
  // (RemoteNames::FetchTake) and takes it, likewise.
  // What this node wants of a name another node published: a waiting take of it (or of a
  // prefix over it) wants the tensor moved here; a waiting acquire, or a watcher of a
  // session other than `except_session`, wants a replica; else nothing.
  enum class Want { kNothing, kReplica, kTake };
  Want Wants(const std::string& name, uint64_t except_session);

 private:
  struct Effects {
    std::vector<std::pair<Completion<tensord::v1::AcquireResponse>, absl::StatusOr<tensord::v1::AcquireResponse>>>
        completions;
    std::vector<std::pair<std::shared_ptr<PushSink>, tensord::v1::SessionResponse>> pushes;
    std::vector<std::pair<std::shared_ptr<WatchSink>, tensord::v1::WatchEvent>> events;
    std::vector<std::unique_ptr<common::BackendBuffer>> garbage;
    std::vector<uint64_t> cancel_timers;
    // Allocations that were given a queue slot: carried out after the lock.
    std::vector<SlotWaiter> admitted;
  };
  // What finishing allocations leaves for after the lock: the answers, in order, and the
  // allocation that makes the next arena (of next_arena_bytes) when a new one overflowed.
  struct FinishedAllocations {
    std::vector<std::pair<Completion<tensord::v1::AllocateResponse>, absl::StatusOr<tensord::v1::AllocateResponse>>>
        answers;
    std::optional<QueuedAllocate> next_arena;
    uint64_t next_arena_bytes = 0;
  };
  // A snapshot buffer as restored: its device, memory and size (no memory: tensors of no bytes).
  struct RestoredBuffer {
    const ResolvedDevice* device = nullptr;
    std::unique_ptr<common::BackendBuffer> memory;
    uint64_t size = 0;
  };

  // The private steps, by the file that holds them. broker.cc: effects, sessions, leases,
  // bindings, retirement and memory given back.
  // Runs what an operation collected, outside the mutex.
  void Deliver(Effects& effects);
  absl::StatusOr<Session*> SessionLocked(uint64_t session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FetchHandles' buffer: NOT_FOUND unless the session leases a tensor in it; FAILED_PRECONDITION: producer gone.
  absl::StatusOr<Buffer*> FetchableBufferLocked(const Session& session, uint64_t buffer_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `session` closed: every tensor in memory it owned (its producer_owned_buffers) retires,
  // unbound as a Delete would; the buffers remember why (Buffer::producer_exited).
  void RetireProducerMemoryLocked(const Session& session, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION naming `tensor` when its memory went with its producer.
  absl::Status CheckMemoryLiveLocked(const Tensor& tensor) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants a lease on `tensor` to `session`; `by_name`: acquired by its name, so the client
  // may cache it and must hear when the tensor retires.
  tensord::v1::AcquireResponse GrantLocked(Session& session, Tensor& tensor, bool by_name = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeRemoveLocked(Tensor& tensor, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A recyclable buffer's last tensor went: into its producer's pool when it may wait
  // there, else freed.
  void RecycleLocked(BufferPool::Entry entry, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees recyclable buffers (their quota released, their memory freed off the RPC threads)
  // and tells each one's producer session, while open, RecycledBufferFreed.
  void FreeRecycledLocked(std::vector<BufferPool::Entry> entries, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves `bytes` of `device`'s quota; when that fails, takes pooled buffers on the device
  // back (oldest first), then unbinds copies (EvictCopiesLocked), trying again after each.
  absl::Status ReserveLocked(const ResolvedDevice& device, uint64_t bytes, std::string_view what,
                             Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes `device`'s quota lacks for `bytes` more (0: they fit).
  uint64_t ShortByLocked(const ResolvedDevice& device, uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees idle pooled buffers on `device`, oldest first, until `bytes` more fit (or none is
  // left); returns whether any went.
  bool FreePooledLocked(const ResolvedDevice& device, uint64_t bytes, std::string_view what, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unbinds tensors published evictable on `device` that no lease or hand-over holds,
  // oldest first, until `bytes` more fit (their recycled buffers freed too); not while names
  // are frozen for a take-over. Returns whether any went.
  bool EvictCopiesLocked(const ResolvedDevice& device, uint64_t bytes, std::string_view what, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The buffer of `tensor_id`, in memory its producer owned, was freed: tells the producer
  // (ExportReleased) while its session is open.
  void ExportReleasedLocked(uint64_t producer_session, uint64_t tensor_id, uint64_t buffer_id,
                            Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `push` for `session`'s stream, or, with none attached, owes it a cache_reset.
  void PushLocked(Session& session, tensord::v1::SessionResponse push, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireLocked(Tensor& tensor, const std::string& old_name, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unbinds and retires; pushes the change to holders and watchers.
  void UnbindLocked(Tensor& tensor, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Binds (retiring what was bound) and tells watchers; waking waiters is the caller's.
  void BindLocked(Tensor& tensor, const std::string& name, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyWatchersLocked(const tensord::v1::WatchEvent& event, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // broker_queues.cc: bounded work queues. An allocation with a QueueSlot takes a slot (or
  // waits for one) before it is carried out; the tensor it makes holds the slot
  // (Tensor::queue_prefix) until it leaves the queue, and a failed allocation gives it back.
  uint64_t AllocateInQueue(uint64_t session_id, const tensord::v1::AllocateRequest& request,
                           Completion<tensord::v1::AllocateResponse> done);
  // Starts a wait for a slot of `prefix`; its charges as a take's.
  absl::StatusOr<uint64_t> StartSlotWaitLocked(Session& session, const tensord::v1::AllocateRequest& request,
                                               Completion<tensord::v1::AllocateResponse>& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `done`, giving the slot of `prefix` back when the allocation fails.
  Completion<tensord::v1::AllocateResponse> GivingSlotBackOnError(std::string prefix,
                                                                  Completion<tensord::v1::AllocateResponse> done);
  // A slot of `prefix` is free: the waiters that now fit are admitted (into `effects`).
  void FreeSlotLocked(const std::string& prefix, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdmitWaitersLocked(const std::string& prefix, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tensor left its queue (unbound, or dropped unpublished): its slot is free. No-op
  // for a tensor that holds none.
  void LeaveQueueLocked(Tensor& tensor, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A tensor that holds a slot is published only directly under its queue's prefix.
  static absl::Status CheckQueuedName(const Tensor& tensor, const std::string& name);
  void ForgetSlotWaiterLocked(const SlotWaiter& waiter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteSlotWaitWith(uint64_t wait_id, absl::Status status);
  // Carries out the allocations admitted into `effects` (outside the mutex).
  void AllocateAdmitted(std::vector<SlotWaiter> admitted);
  void DescribeQueuesLocked(uint64_t session_id, tensord::v1::StatusResponse& response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // broker_allocate.cc: Allocate validates, places and reserves; memory is made on the
  // executor; FinishAllocate registers what was made and answers.
  // Allocate without a queue slot to wait for (none asked, or one held already).
  void AllocateNow(uint64_t session_id, const tensord::v1::AllocateRequest& request,
                   Completion<tensord::v1::AllocateResponse> done);
  // A request's namespace, description and tags, checked, as a new tensor on the broker's device; nothing else set.
  absl::StatusOr<Tensor> DescribeNewTensor(const std::string& ns, const tensord::v1::TensorDesc& desc,
                                           const google::protobuf::Map<std::string, std::string>& tags) const;
  // ACL, lease cap and uid charge, then Placement's choice with its memory reserved; on an error nothing is kept.
  absl::StatusOr<Placement::Choice> PlaceAllocationLocked(Session& session, Tensor& tensor,
                                                          const Placement::Request& wants, uint64_t size,
                                                          Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves quota for one more arena of `bytes` in namespace `ns`.
  absl::Status ReserveArenaLocked(std::string_view ns, uint64_t bytes, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The session closed: its arenas go once empty (those empty now go at once, their memory
  // given back and freed off the RPC threads).
  void ReleaseArenasLocked(Session& session, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes memory for `tensor` on the executor (a dedicated buffer, or a new arena) and
  // finishes with FinishAllocate; the bytes are reserved already.
  void PostAllocation(uint64_t session_id, uint64_t size, bool arena, Tensor tensor,
                      Completion<tensord::v1::AllocateResponse> done);
  // `arena`: the memory is a new arena for the session's namespace, the tensor goes in it
  // with the allocations queued behind it.
  void FinishAllocate(uint64_t session_id, uint64_t size, bool arena, Tensor tensor,
                      absl::StatusOr<std::unique_ptr<common::BackendBuffer>> memory,
                      Completion<tensord::v1::AllocateResponse> done);
  // `made`, or CANCELLED with no `session`; a node short of memory first gets `device`'s idle pooled buffers back.
  absl::Status CheckMadeMemoryLocked(const Session* session, absl::Status made, const ResolvedDevice& device,
                                     Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers `allocation` with `why`, its uid charges given back.
  void RefuseLocked(QueuedAllocate& allocation, const absl::Status& why, FinishedAllocations& finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers the tensor in its made buffer (or none) within the lease cap; else frees the buffer and its quota.
  void FinishBufferLocked(Session& session, QueuedAllocate allocation, std::unique_ptr<common::BackendBuffer> memory,
                          uint64_t size, FinishedAllocations& finished, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the arena made to the session's in `ns` and registers `batch` where Placement::PlaceBatch puts it.
  void FillArenaLocked(Session& session, const std::string& ns, uint64_t size,
                       std::unique_ptr<common::BackendBuffer> memory, std::vector<QueuedAllocate> batch,
                       FinishedAllocations& finished, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves the next arena for `overflow` (its first makes it, the rest queue), or refuses them all.
  void QueueNextArenaLocked(uint64_t session_id, const std::string& ns, Placement::Overflow overflow,
                            FinishedAllocations& finished, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a new CREATING tensor (and its buffer, when it has memory) with a producer lease.
  tensord::v1::AllocateResponse RegisterLocked(Session& session, Tensor tensor,
                                               std::unique_ptr<common::BackendBuffer> memory,
                                               uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a new CREATING tensor in a pooled buffer of its session, the buffer registered
  // again under its own id.
  tensord::v1::AllocateResponse RegisterRecycledLocked(Session& session, Tensor tensor, BufferPool::Entry entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // broker_publish.cc: exports, publish, TTLs.
  // Export's handle: its bytes, or the session's staged fd, taken (NOT_FOUND: not staged by it).
  absl::StatusOr<common::MemoryHandle> ExportedHandle(uint64_t session_id, const tensord::v1::ExportRequest& request);
  // ACL and lease cap, `tensor` stamped as the session's, its uid charged, `size` reserved; on an error, nothing.
  absl::Status ReserveExportLocked(Session& session, Tensor& tensor, uint64_t size, std::string_view what,
                                   Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tensor the session is creating: NOT_FOUND (not its own), FAILED_PRECONDITION (published already).
  absl::StatusOr<Tensor*> PublishableLocked(uint64_t session_id, uint64_t tensor_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `tensor` may take request.name() in `ns`: its namespace, the ACL, if_absent and if_generation.
  absl::Status CheckPublishedNameLocked(const Session& session, const Tensor& tensor,
                                        const tensord::v1::PublishRequest& request, std::string_view ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks the seals of `tensor`'s buffer (CheckShareable), once, before any reader can get it.
  absl::Status SealForReadersLocked(const Tensor& tensor) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publish once every check passed: description, namespace, tags, SEALED, fence, name (and TTL) or generation.
  void CommitPublishLocked(Session& session, Tensor& tensor, const tensord::v1::PublishRequest& request,
                           std::string_view ns, std::optional<common::TensorLayout> new_layout,
                           std::optional<std::map<std::string, std::string>> merged_tags, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publish's `desc` for a CREATING tensor: same device, and an extent that fits the region
  // the tensor was allocated (its arena slot, or its buffer from its offset on).
  absl::Status CheckFitsRegionLocked(const Tensor& tensor, const tensord::v1::TensorDesc& desc,
                                     const common::TensorLayout& layout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleTtlLocked(Tensor& tensor, uint64_t ttl_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireTtl(uint64_t tensor_id, uint64_t generation);

  // broker_reads.cc and broker_take.cc: acquires and takes.
  // Acquire; `may_fetch`: a shared name not bound here may be fetched from the cluster
  // (false once it was: the retry after the fetch).
  uint64_t AcquireHere(uint64_t session_id, const tensord::v1::AcquireRequest& request,
                       Completion<tensord::v1::AcquireResponse> done, bool may_fetch);
  // Whether an acquire of `name` that found nothing bound here goes to the cluster.
  bool FetchesLocked(const std::string& name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Take; `may_fetch` as for AcquireHere.
  uint64_t TakeHere(uint64_t session_id, const tensord::v1::TakeRequest& request,
                    Completion<tensord::v1::AcquireResponse> done, bool may_fetch);
  // NOT_FOUND for a name nothing is bound to: `lead` and the name, and a bound name of its
  // namespace a typo away if there is one. Only after the caller's access to that namespace
  // was checked, so the hint tells nothing it could not list.
  absl::Status NotBoundLocked(std::string_view lead, const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GrantLocked, if CheckLeaseCapLocked lets `session` hold one more lease.
  absl::StatusOr<tensord::v1::AcquireResponse> GrantWithinCapLocked(Session& session, Tensor& tensor,
                                                                    bool by_name = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An acquire by name (by id) now: a lease, or why not; nullopt to wait, only when `may_wait`.
  std::optional<absl::StatusOr<tensord::v1::AcquireResponse>> AcquireByNameLocked(Session& session,
                                                                                  const Waiter& waiter,
                                                                                  bool may_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<absl::StatusOr<tensord::v1::AcquireResponse>> AcquireByIdLocked(Session& session,
                                                                                const Waiter& waiter, bool may_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A take now: a lease on what it names, which it unbinds, or why not; nullopt to wait, when it asks to.
  std::optional<absl::StatusOr<tensord::v1::AcquireResponse>> TakeNowLocked(Session& session,
                                                                            const tensord::v1::TakeRequest& request,
                                                                            Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT when `tensor` is not memory of the type a take maps (`wanted`), before anything is unbound.
  static absl::Status CheckTakenMemory(tensord::v1::DeviceType wanted, const Tensor& tensor);

  // broker_waits.cc: waits for a name, granted by a publish, ended by a timeout, a cancel or
  // shutdown.
  // Checks the session's and its uid's caps for one more wait on `target`, and charges the
  // uid for it.
  absl::Status ReserveWaitLocked(const Session& session, std::string_view target)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves (ReserveWaitLocked) and registers a wait with its timer, taking `done`; else CANCELLED or the caps' error.
  absl::StatusOr<uint64_t> StartWaitLocked(Session& session, Waiter waiter,
                                           Completion<tensord::v1::AcquireResponse>& done,
                                           std::optional<uint64_t> timeout_ms, std::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back what a waiter removed from waiters_ held: one of its session's waits (when
  // the session is still open) and its uid's charges.
  void ForgetWaiterLocked(const Waiter& waiter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a wait's session may be granted `tensor` now that it matched: access is checked
  // again at the grant, since an unnamed tensor gets its namespace only when published.
  absl::Status CheckGrantLocked(const Session& session, const Waiter& waiter, const Tensor& tensor) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The waiters `tensor` satisfies, now bound: every acquirer, then the oldest take that may
  // have it (which unbinds it).
  void WakeWaitersLocked(Tensor& tensor, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the waiter `wait_id`, which `tensor` matched, and completes it: with a lease when
  // it may be granted one (true), else with why not (false; the tensor stays for the next).
  bool GrantWaiterLocked(uint64_t wait_id, Tensor& tensor, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the wait `wait_id` with `status` (a timeout, a cancel, shutdown); nothing when it was
  // granted or ended already.
  void CompleteWaitWith(uint64_t wait_id, absl::Status status);

  // broker_status.cc: what GetStatus shows whom.
  // Whose per-uid Status figures `session_id` sees, in `only_uid`: every uid (nullopt) for
  // session 0 (the metrics page, the service manager), root and the daemon's uid; else its
  // own uid. False when the session is gone (nothing to show).
  bool StatusScopeLocked(uint64_t session_id, std::optional<uid_t>& only_uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GetStatus's optional parts.
  void DescribeSessionsLocked(uint64_t session_id, tensord::v1::StatusResponse& response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With a session: only the tensors its uid may read (root and the daemon's uid read all);
  // with none (the metrics page, the service manager's status line): every tensor.
  void DescribeNamespacesLocked(uint64_t session_id, tensord::v1::StatusResponse& response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // broker_watch.cc: watchers.
  // Gives back what a watcher was charged to its uid.
  void ReleaseWatcherLocked(const Watcher& watcher) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // broker_limits.cc: caps and per-uid charges.
  // RESOURCE_EXHAUSTED when `session` may not hold one more lease (its cap, or its uid's
  // metadata bytes) / start one more wait.
  absl::Status CheckLeaseCapLocked(const Session& session) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckWaitCapLocked(const Session& session) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges the producer's uid for a tensor about to be registered: one tensor, its
  // metadata, and `host_bytes` of a dedicated buffer outside an ACL'd namespace. Records the
  // charges in `tensor`; nothing is charged on an error.
  absl::Status ChargeTensorLocked(Tensor& tensor, uint64_t host_bytes, std::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnchargeTensorLocked(const Tensor& tensor) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges (or refunds) the producer's uid for `tensor`'s metadata once published with
  // `desc` and `tags` under `name` in `ns`; nothing changes on an error.
  absl::Status RechargeMetadataLocked(Tensor& tensor, const tensord::v1::TensorDesc& desc, std::string_view ns,
                                      std::string_view name, const std::map<std::string, std::string>& tags)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // broker_hand_over.cc: hand-overs.
  // The leased tensor a hand-over would hold: NOT_FOUND (no such lease), FAILED_PRECONDITION (unpublished, gone).
  absl::StatusOr<Tensor*> HandedOverTensorLocked(uint64_t session_id, uint64_t lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when `uid`, or the lease, has the most hand-overs pending it may.
  absl::Status CheckHandOverCapsLocked(uid_t uid, uint64_t lease_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A hand-over of `tensor` by `uid`: the memory it pins, and how much of it the uid is charged.
  PendingHandOver NewHandOverLocked(const Tensor& tensor, uid_t uid, uint64_t lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges the maker's uid for `hand_over` (its pin, with its first token on the tensor, and the entry), or nothing.
  absl::Status ChargeHandOverLocked(const PendingHandOver& hand_over) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Acquire's hand_over target: the pending hand-over becomes a lease of the session, once.
  // A redeemer that may not read the tensor, or may hold no more leases, leaves it pending;
  // a tensor whose memory went with its producer ends it.
  absl::StatusOr<tensord::v1::AcquireResponse> RedeemHandOver(uint64_t session_id, std::string_view token);
  void ExpireHandOver(const std::string& token);
  // Gives back what a hand-over removed from hand_overs_ held: its uid's charges (the pinned
  // memory with its uid's last token on the tensor) and its hold on the tensor (which may go
  // with it); `cancel_timer` unless its timer is what fired.
  void EndHandOverLocked(const PendingHandOver& hand_over, bool cancel_timer, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The memory pending hand-overs pin, by maker uid (every uid for session 0, root and the
  // daemon's uid; else the caller's own).
  void DescribeHandOversLocked(uint64_t session_id, tensord::v1::StatusResponse& response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // broker_snapshot.cc: take-over.
  // UNAVAILABLE while FreezeAndSnapshot's freeze holds.
  absl::Status CheckNamesMayChangeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Snapshot SnapshotLocked(const std::set<uint64_t>* stored) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds buffer `buffer_id` to `out` with its fds (none when in `stored`), or says why its memory is not carried.
  absl::Status SnapshotBufferLocked(uint64_t buffer_id, const std::set<uint64_t>* stored, Snapshot& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Snapshot buffer `buffer_id`'s memory, made from its fds (taken from `fds`) and reserved; or why not.
  absl::StatusOr<RestoredBuffer> RestoreBufferLocked(
      const std::map<uint64_t, const tensord::v1::SnapshotBuffer*>& buffers, uint64_t buffer_id,
      std::vector<common::UniqueFd>& fds, const std::string& what, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One buffer's tensors, each checked against it and charged to its uid; those refused are logged and counted.
  std::vector<std::pair<Tensor, const tensord::v1::SnapshotTensor*>> ChargeRestoredLocked(
      const std::vector<const tensord::v1::SnapshotTensor*>& entries, const RestoredBuffer& buffer,
      RestoreReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers the buffer and its tensors, each bound at its generation with what is left of its TTL.
  void AddRestoredLocked(RestoredBuffer buffer,
                         std::vector<std::pair<Tensor, const tensord::v1::SnapshotTensor*>> accepted, int64_t now,
                         RestoreReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const BrokerOptions options_;
  const std::string instance_nonce_;
  const int64_t started_unix_ms_;
  const AccessPolicy access_;
  const std::unique_ptr<BackendRegistry> backends_;

  absl::Mutex mu_;
  TensorRegistry registry_ ABSL_GUARDED_BY(mu_);
  HandOverTable hand_overs_ ABSL_GUARDED_BY(mu_);
  SessionManager sessions_ ABSL_GUARDED_BY(mu_);
  WaitQueue waiters_ ABSL_GUARDED_BY(mu_);
  QueueSlots queue_slots_ ABSL_GUARDED_BY(mu_);
  ArenaAllocator arenas_ ABSL_GUARDED_BY(mu_);  // and the allocations waiting for a new arena
  WatcherSet watchers_ ABSL_GUARDED_BY(mu_);
  UidQuota uid_quota_ ABSL_GUARDED_BY(mu_);
  LeaseTable leases_ ABSL_GUARDED_BY(mu_);  // keeps registry_'s holders and uid_quota_'s charges
  MemoryQuota memory_quota_ ABSL_GUARDED_BY(mu_);  // device memory handed out, by device key
  BufferPool pool_ ABSL_GUARDED_BY(mu_);
  Placement placement_ ABSL_GUARDED_BY(mu_);  // decides over arenas_ and pool_
  uint64_t releases_not_found_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t leases_reclaimed_ ABSL_GUARDED_BY(mu_) = 0;  // held by sessions when they closed
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool frozen_ ABSL_GUARDED_BY(mu_) = false;  // names are being handed to a new daemon
  RemoteNames* remote_ ABSL_GUARDED_BY(mu_) = nullptr;  // ShareNamesThrough
  std::atomic<uint64_t> names_version_{0};     // bumped under mu_ by every bind and unbind

  // Declared last: their threads stop first, while everything above is still alive.
  TimerQueue timers_;
  Executor executor_{2};
};

}  // namespace tensord::server
