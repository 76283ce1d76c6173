// The values tensord's C++ client API takes and gives (tensord/client.h includes this
// header; include that one): dtypes, waits and their cancellation, GPU stream numbers, what
// describes a tensor, a lease holder, a session and the broker's status, and the options
// of each call. Only tensord's own types; nothing here throws.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensord/dlpack.h"
#include "tensord/status.h"

#ifndef TENSORD_EXPORT
#define TENSORD_EXPORT __attribute__((visibility("default")))
#endif

namespace tensord {

namespace dtypes {
inline constexpr DLDataType kBool{kDLBool, 8, 1};
inline constexpr DLDataType kInt8{kDLInt, 8, 1};
inline constexpr DLDataType kInt16{kDLInt, 16, 1};
inline constexpr DLDataType kInt32{kDLInt, 32, 1};
inline constexpr DLDataType kInt64{kDLInt, 64, 1};
inline constexpr DLDataType kUInt8{kDLUInt, 8, 1};
inline constexpr DLDataType kUInt16{kDLUInt, 16, 1};
inline constexpr DLDataType kUInt32{kDLUInt, 32, 1};
inline constexpr DLDataType kUInt64{kDLUInt, 64, 1};
inline constexpr DLDataType kFloat16{kDLFloat, 16, 1};
inline constexpr DLDataType kFloat32{kDLFloat, 32, 1};
inline constexpr DLDataType kFloat64{kDLFloat, 64, 1};
inline constexpr DLDataType kBFloat16{kDLBfloat, 16, 1};
inline constexpr DLDataType kComplex64{kDLComplex, 64, 1};
inline constexpr DLDataType kComplex128{kDLComplex, 128, 1};
}  // namespace dtypes

// How long a call waits for a name to appear. Zero (the default) fails at once with
// NOT_FOUND; a positive wait ends with DEADLINE_EXCEEDED; forever is explicit.
class Wait {
 public:
  constexpr Wait() = default;
  static constexpr Wait None() { return Wait(); }
  static constexpr Wait For(std::chrono::milliseconds d) { return Wait(d.count() < 0 ? 0 : d.count(), false); }
  static constexpr Wait Forever() { return Wait(0, true); }
  constexpr bool forever() const { return forever_; }
  constexpr int64_t millis() const { return millis_; }

 private:
  constexpr Wait(int64_t millis, bool forever) : millis_(millis), forever_(forever) {}
  int64_t millis_ = 0;
  bool forever_ = false;
};

namespace internal {
class CancelState;
}  // namespace internal

// Ends blocking waits early: pass it in AcquireOptions::cancel or TakeOptions::cancel, and
// Cancel() it from any thread. A call waiting with it sends its wait once, as one request for
// the whole Wait (forever included), and never re-sends it; Cancel() asks the broker to drop
// that wait, and the call returns CANCELLED once the broker has dropped it (no waiter, no
// timer is left there). A call cancelled before it returns returns CANCELLED whatever the
// broker answered: when the grant raced the cancel (the tensor was published just before the
// cancel reached the broker), the lease it was granted is released; for a Take the tensor is
// then gone, as for any take whose result is dropped. A call that starts with the token
// cancelled already returns CANCELLED at once without asking the broker (a lease-cache hit,
// which needs no request, is still returned).
//
// A caller that can notice what should end the wait only on its own thread (Python runs
// signal handlers on the thread that waits) gives a `poll`: the waiting thread calls it every
// `period` while it waits, holding no lock of the client, and a true result cancels the token
// there. Without one, a waiting call wakes for nothing but its answer.
//
// One token may serve any number of calls, one after another or at once; Cancel() cancels
// every one waiting and every later one. It must outlive the calls it is given to.
// Thread-safe; Cancel() is not async-signal-safe. A broker older than this feature ignores
// the cancel: a call with a `poll` then gives up on its own 10 s after it was cancelled (a
// lease granted later is released), one without waits as its Wait says.
class TENSORD_EXPORT CancelToken {
 public:
  CancelToken();
  CancelToken(std::function<bool()> poll, std::chrono::milliseconds period);
  ~CancelToken();
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  // Cancels every call waiting with this token, and makes later ones return at once. Returns
  // without waiting for them. Idempotent.
  void Cancel();
  bool cancelled() const;

 private:
  friend class internal::CancelState;
  std::shared_ptr<internal::CancelState> state_;
};

// GPU streams, as DLPack numbers them and the CUDA driver reads them: a CUstream (a
// cudaStream_t) cast to uintptr_t, or one of these. Host tensors ignore streams.
inline constexpr uintptr_t kLegacyDefaultStream = 1;     // CU_STREAM_LEGACY
inline constexpr uintptr_t kPerThreadDefaultStream = 2;  // CU_STREAM_PER_THREAD
// PublishOptions::stream only (DLPack's -1): the producer's writes are complete (it has
// synchronized), so no ready event is recorded and consumers' streams wait for nothing. For
// consumers that cannot open this process's events: one in another PID namespace (a
// container that shares none with the producer) gets CUDA_ERROR_INVALID_CONTEXT from
// cuIpcOpenEventHandle, seen on an H200.
inline constexpr uintptr_t kNoStream = ~uintptr_t{0};

// A kind of memory tensord knows (tensord::MemoryKinds() in client.h lists them), for code
// that names devices or honours DLPack's stream protocol without a switch of its own.
struct MemoryKindInfo {
  // What `stream` in DLPack's __dlpack__(stream=...) means for the kind's tensors.
  enum class StreamRule : uint8_t {
    kNone,      // host memory: nothing to order; a consumer's stream is ignored
    kCuda,      // None: kLegacyDefaultStream; 0 is ambiguous and refused; -1: no ordering;
                // else a CUstream
    kHostWait,  // no default stream (Level Zero): None waits on the host; -1: no ordering;
                // else a ze_command_list_handle_t in tensord's context (UseLevelZeroContext)
  };
  int32_t device_type = 0;         // its DLDeviceType: kDLCPU, kDLCUDA, kDLCUDAHost, kDLOneAPI
  std::string_view name;           // "host", "cuda", "cuda_host", "level_zero": status, errors
  std::string_view device_prefix;  // "cpu", "cuda", "cuda_host", "xpu": how users and torch
                                   // name its devices
  bool numbered = false;           // devices are "cuda:1"; false: one device, "cpu"
  bool host_readable = false;      // the CPU reads its bytes through data()
  bool own_memory = false;         // false: a view a consumer asks for (cuda_host: pinned),
                                   // never a device to allocate on
  StreamRule streams = StreamRule::kNone;
};

// Identifies a tensor by id instead of by name.
struct TensorId {
  uint64_t value = 0;
};

// What to allocate.
struct TensorSpec {
  DLDataType dtype = dtypes::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty: C order (row-major, compact)
  DLDevice device{kDLCPU, 0};
  bool isolated = false;  // ask for a dedicated buffer even for a small tensor
  std::map<std::string, std::string> tags;
};

enum class TensorState { kCreating, kSealed, kRetired };

struct TensorInfo {
  uint64_t tensor_id = 0;
  std::string name;  // empty when unnamed
  uint64_t generation = 0;
  DLDataType dtype{};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, always filled in
  uint64_t byte_offset = 0;
  DLDevice device{kDLCPU, 0};
  TensorState state = TensorState::kCreating;
  std::map<std::string, std::string> tags;
  int64_t created_unix_ms = 0;
  uint32_t lease_count = 0;
  uint64_t nbytes = 0;  // element bytes: product of shape times item size
  uint64_t buffer_id = 0;
  uint64_t buffer_size = 0;
  uint64_t buffer_offset = 0;  // where the tensor's extent starts in its buffer
  bool arena = false;          // the buffer is an arena shared with other small tensors
  // A recycled buffer: once this tensor is gone it may carry its producer's next tensor in
  // the same namespace (a large tensor allocated in a namespace).
  bool recyclable = false;
};

struct LeaseHolder {
  uint64_t session_id = 0;
  uint32_t pid = 0;  // 0 across pid namespaces; for display only
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t leases = 0;
  bool producer = false;
};

struct TensorStat {
  TensorInfo info;
  std::vector<LeaseHolder> holders;
};

// One device a backend serves, and what the broker holds on it.
struct DeviceUsage {
  DLDevice device{kDLCPU, 0};  // device_id: the daemon's ordinal, which may differ from yours
  std::string uuid;            // "GPU-..." for CUDA; empty for host memory
  std::string key;             // "host", "cuda:GPU-...": what quotas and errors name
  std::string name;            // "host memory", the driver's device name
  uint64_t total_bytes = 0;    // 0: not known
  uint64_t bytes_in_use = 0;
  uint64_t bytes_limit = 0;
  uint64_t bytes_pooled = 0;   // of bytes_in_use: recycled buffers waiting for their producer
};

// A memory backend of the daemon: built or not, available or why not, its devices.
struct BackendInfo {
  std::string name;  // "host", "cuda", "level_zero"
  bool built = false;
  std::string unavailable_reason;  // empty: available
  std::vector<DeviceUsage> devices;
};

// One connected client, as GetStatus({.sessions = true}) lists it: what it holds, so that
// memory can be traced to a process.
struct SessionUsage {
  uint64_t id = 0;
  uint32_t pid = 0;  // the kernel's word (SO_PEERCRED) at connect
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string client_name;
  int64_t opened_unix_ms = 0;
  uint64_t leases = 0;            // held now
  uint64_t bytes_leased = 0;      // of the tensors it holds leases on, each counted once
  uint64_t tensors_produced = 0;  // tensors it made that still exist
  uint64_t bytes_produced = 0;
  uint64_t leases_granted = 0;    // since it connected: acquires, takes, allocations, redeems
  uint64_t publishes = 0;         // since it connected
  uint64_t waiting = 0;           // its acquires and takes waiting for a name now
};

// Client::ListPage: where a page starts and how long it may be.
struct ListPageOptions {
  // The last page's next_page_token, with the same prefix; empty: the first page.
  std::string page_token;
  // The most entries in the page; 0: as many as one answer holds (the broker answers at
  // most 4096 entries and 1 MiB of them, whatever is asked).
  size_t limit = 0;
};

// One page of a listing.
struct TensorPage {
  std::vector<TensorInfo> tensors;  // in name order
  // Empty: nothing is left. Else the ListPageOptions::page_token of the next page (the last
  // name of this one: the next page starts after it).
  std::string next_page_token;
};

// What one uid's pending hand-overs hold alive, each tensor once. The host bytes count
// against the uid's --max-host-bytes-per-uid (but for its own buffers, which count there
// already); no per-uid quota binds device memory.
struct HandOverPins {
  uint32_t uid = 0;
  uint64_t hand_overs = 0;
  uint64_t host_bytes = 0;
  uint64_t device_bytes = 0;
};

struct StatusOptions {
  // List sessions too: every session for root and the daemon's own uid, else only those of
  // the caller's uid.
  bool sessions = false;
  // List the bounded work queues (Client::AllocateInQueue) in namespaces the caller may read.
  bool queues = false;
};

// A bounded work queue as it stands (GetStatus with StatusOptions::queues).
struct QueueStatus {
  std::string prefix;
  uint32_t depth = 0;              // as its latest allocation asked
  uint32_t slots_held = 0;         // its tensors: being written, or published and not taken
  uint64_t published = 0;          // bound under the prefix, waiting for a taker
  uint32_t producers_waiting = 0;  // allocations waiting for a slot
  uint32_t takers_waiting = 0;     // takes of the prefix waiting for a tensor
};

// The broker as a node of a cluster (its --cluster-etcd settings; docs/cluster.md).
struct ClusterStatus {
  std::string node;
  std::string listen;                   // where other brokers reach this one
  std::vector<std::string> namespaces;  // shared across the cluster
  std::string etcd_endpoint;            // the etcd member its calls go to now
  bool joined = false;                  // its etcd lease is held: its names are in the directory
  uint64_t names_recorded = 0;          // names it published that are in the directory
  uint64_t replicas = 0;                // names bound here as copies of other nodes' tensors
  uint64_t pulls = 0;                   // transfers from other nodes that completed, since start
  uint64_t bytes_pulled = 0;
  uint64_t pulls_failed = 0;
  uint64_t reads_open = 0;              // other nodes' reads of tensors here, open now
  uint64_t reads_served = 0;            // since start
  uint64_t bytes_served = 0;
  uint64_t device_copies = 0;           // device tensors staged through host memory, since start
};

struct BrokerStatus {
  std::string version;
  uint32_t pid = 0;
  uint32_t uid = 0;
  int64_t uptime_ms = 0;
  uint64_t host_bytes_in_use = 0;
  uint64_t host_bytes_limit = 0;
  uint64_t tensors = 0;
  uint64_t named_tensors = 0;
  uint64_t buffers = 0;
  uint64_t leases = 0;
  uint64_t sessions = 0;
  std::string socket;
  uint64_t releases_not_found = 0;
  // Recycled buffers waiting in producers' pools: counted in host_bytes_in_use, and taken
  // back before an allocation would fail.
  uint64_t host_bytes_pooled = 0;
  uint64_t pooled_buffers = 0;
  uint64_t hand_overs_pending = 0;  // hand-over tokens neither redeemed nor expired
  // Leases still held by sessions when they ended (exited, killed, or closed without
  // releasing), released by the broker, since it started.
  uint64_t leases_reclaimed = 0;
  std::vector<BackendInfo> backends;  // host first
  std::vector<SessionUsage> session_usage;  // with StatusOptions::sessions; by id
  // Memory pending hand-overs hold alive, by the uid that made them (every uid for root and
  // the daemon's uid, else only the caller's); by uid.
  std::vector<HandOverPins> hand_over_pins;
  std::vector<QueueStatus> queues;  // with StatusOptions::queues; by prefix
  std::optional<ClusterStatus> cluster;  // where the broker is a node of a cluster
};

struct WatchEvent {
  enum class Kind { kBound, kUnbound, kReset };
  Kind kind = Kind::kBound;
  std::string name;
  uint64_t generation = 0;
  std::optional<TensorInfo> tensor;  // for kBound
};

struct AcquireOptions {
  Wait wait;
  // Ends the wait early when cancelled (see CancelToken); null: only `wait` ends it. Applies
  // to Acquire by name or id and AcquireMany (a cancelled batch returns CANCELLED and
  // releases what it was granted), not to Redeem.
  const CancelToken* cancel = nullptr;
  // With a name: the binding must be at least this generation.
  uint64_t min_generation = 0;
  // A shared read-only mapping (flagged read-only in versioned DLPack) instead of the
  // default private copy-on-write one, where writes change only this process's pages.
  bool readonly = false;
  // A pinned view of a host tensor: the mapping is registered with cuMemHostRegister
  // (PORTABLE, so every CUDA context of this process sees it pinned), and a host-to-device
  // copy from it runs at full bus speed without a staging copy. info().device and the
  // DLPack views say {kDLCUDAHost, 0}; data() is a host pointer. Always a shared read-only
  // mapping (as readonly = true, which it implies): pinning a copy-on-write mapping would
  // copy every page. The whole buffer is registered once, when this process first maps it
  // pinned (an arena's many small tensors share one registration), and unregistered before
  // it is unmapped; a pinned and an unpinned view of one buffer are separate mappings.
  // A zero-byte tensor has no memory to pin: its device stays the tensor's own.
  // Needs the cuda backend and a CUDA driver with a device; without them acquires answer
  // UNIMPLEMENTED (this build has no cuda backend) or UNAVAILABLE (no driver or no device),
  // saying why; a device that cannot pin read-only memory answers UNIMPLEMENTED. A tensor
  // that is not host memory answers INVALID_ARGUMENT naming it. Take and TakeMany pin as
  // TakeOptions::pinned says. docs/memory-backends.md says what ran on a GPU.
  bool pinned = false;
  // Device tensors: the stream this process will use the tensor on. The acquire makes it
  // wait (on the GPU, no host wait) for the work the producer published after, and the
  // lease is released only once the work queued on it before the last reference went has
  // finished. More streams: TensorRef::UseOnStream.
  uintptr_t stream = kLegacyDefaultStream;
};

// Take and TakeMany: how long to wait, and how host tensors are mapped: shared read-only
// (as AcquireOptions::readonly: a consumer that only reads, which also spares the release
// of a recycled buffer its check for private pages) or pinned (as AcquireOptions::pinned: a
// trainer that takes host batches and copies them to a GPU).
// A take cannot be undone, so a pinned take fails before anything is unbound where this
// process cannot pin (no driver: UNAVAILABLE), and the broker refuses a tensor that is not
// host memory (INVALID_ARGUMENT, "it stays bound"). A mapping that fails after the take
// (the driver will not register that much memory) loses the tensor, as any take's does.
struct TakeOptions {
  Wait wait;
  const CancelToken* cancel = nullptr;  // as AcquireOptions::cancel
  bool pinned = false;
  bool readonly = false;
};

// A slot of a bounded work queue, for Client::AllocateInQueue.
struct QueueSlotOptions {
  // At most this many tensors are in the queue at once (1 to 65536): allocated for it and
  // not yet taken.
  uint32_t depth = 0;
  // How long to wait while the queue is full; Wait::None(): RESOURCE_EXHAUSTED at once.
  Wait wait = Wait::Forever();
  const CancelToken* cancel = nullptr;  // as AcquireOptions::cancel
};

struct PublishOptions {
  enum class Condition { kAlways, kIfAbsent, kIfGeneration };
  Condition condition = Condition::kAlways;
  uint64_t generation = 0;  // for kIfGeneration
  std::chrono::milliseconds ttl{0};  // 0: the binding stays until deleted or replaced
  // Device tensors: the stream the work that wrote the tensor was queued on. Publish
  // records a "ready" event there (no host wait) that every consumer's stream waits on.
  // kNoStream: the writes are done; no event (see kNoStream).
  uintptr_t stream = kLegacyDefaultStream;
  // Added to the tags the tensor was allocated with (TensorSpec::tags); a key it has
  // already is replaced. Bounded in all as TensorSpec::tags (INVALID_ARGUMENT).
  std::map<std::string, std::string> tags;
  // The name is unbound when this client's session ends (the process exits, is killed, or
  // the Client goes), unless it was unbound or replaced before: for work nobody should
  // take once its producer is gone. Leases already taken on the tensor stay good.
  bool unbind_on_exit = false;
};

// Client::HandOver's result: a one-time token that another process redeems
// (Client::Redeem) for a lease of its own on the same tensor.
struct HandOverToken {
  // 64 hex digits. A bearer secret: whoever has it and may read the tensor can redeem it,
  // so send it only where the tensor may go (a multiprocessing pipe or queue), never to a log.
  std::string token;
  TensorInfo tensor;  // what it hands over
  std::chrono::milliseconds ttl{0};  // how long it stays redeemable, as the broker granted
};

// Client::CancelHandOvers's result.
struct CancelledHandOvers {
  uint64_t cancelled = 0;
  // Tokens given that named no pending hand-over of this uid: redeemed, expired, cancelled,
  // never made, or another uid's.
  uint64_t not_found = 0;
};

// One element of Client::AllocateMany.
struct AllocateItem {
  std::string ns;
  TensorSpec spec;
};

struct ClientOptions {
  // Empty: $TENSORD_SOCKET, else the per-user socket if one is there, else
  // /run/tensord/tensord.sock. Whichever it is, its directory must pass a rule before the
  // client connects: the per-user one ($XDG_RUNTIME_DIR/tensord, /tmp/tensord-$UID) must be
  // ours with mode 0700 and not a symlink; any other must belong to root, to us or to a
  // trusted daemon uid, and be writable by no one else (by its group only when root owns it,
  // by others only when root owns it and it is sticky, like /tmp).
  std::string socket_path;
  std::string client_name;  // shown by the broker; default: the program's name
  // uids besides root and our own that the daemon may run as (and own its socket directory).
  // Empty: $TENSORD_TRUSTED_DAEMON_UIDS (uids separated by commas, such as 10001) if set;
  // Connect answers INVALID_ARGUMENT naming the variable when it holds something else.
  std::vector<uint32_t> trusted_daemon_uids;
  // Keep a lease after its last local view goes, while the tensor is still the current
  // binding of the name it was acquired by, so a repeated Acquire needs no round trip.
  bool lease_cache = true;
  std::chrono::milliseconds lease_cache_linger{2000};
  // For a steady producer: once an Allocate in a namespace was granted a recycled-kind
  // buffer (dedicated host memory), the next Allocate of the same description, tags and
  // namespace is sent at once, so the broker grants it while this one is filled and the next
  // call only collects it. Costs one more buffer held per session, counted in the quota
  // (given back when an Allocate runs out of room); an Allocate of anything else gives the
  // early one up (its buffer goes to this producer's pool). Off by default.
  bool allocate_ahead = false;
};

}  // namespace tensord
