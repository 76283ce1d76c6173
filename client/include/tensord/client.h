// tensord C++ client: share tensors between processes on one node without copying them.
//
// A producer allocates a tensor in the broker (`Allocate`), fills it through the pointer it
// gets back, and publishes it under a name (`Publish`). A consumer acquires it by name or id
// (`Acquire`) and gets a `TensorRef`: a lease on the tensor plus a mapping of its pages.
// `ToDLPack()` / `ToDLPackVersioned()` make DLPack views that point at the same pages; each
// view holds its own reference, and its deleter only drops that reference (it never
// blocks and never makes an RPC). When the last reference to a lease goes, the release is
// queued and sent by a client thread within 1 ms (or at 256 queued releases); `Flush()`
// sends it at once. The broker keeps the memory alive while any lease is held, and releases
// every lease of a process the instant that process exits, however it exits.
//
// Errors are `tensord::Status` values with canonical codes (the same numbers as gRPC's);
// nothing here throws. This header exposes only tensord's own types.
//
// Thread-safety: a `Client` may be shared by any number of threads. A `TensorRef` is a
// handle like a unique_ptr: move it between threads, do not use one from two threads at
// once. DLPack views may be deleted from any thread, also after the Client is gone.
//
// fork(): a child process never keeps its parent's session alive (unless the program opted
// out of the library's process hooks, below). The child's Client drops the inherited
// connection and opens a session of its own when the child first uses it; TensorRefs
// inherited from the parent stay readable in the child but hold no lease there.
//
// What the library does to the process: gRPC, underneath, cannot be used in a child that
// inherited it live, so when the library is loaded it sets GRPC_POLL_STRATEGY=poll and
// GRPC_ENABLE_FORK_SUPPORT=1 in the environment (unless the program set them already), and
// the first Client to connect installs pthread_atfork handlers that stop gRPC just before a
// fork() and let both sides start it afresh (falling back to gRPC's own fork hooks, looked
// up with dlsym, when gRPC cannot stop). It also installs an atexit handler that closes every
// Client before static destructors run.
//
// To keep the environment and the fork handlers to itself, a program is started with
// TENSORD_NO_PROCESS_HOOKS=1 (read when the library loads, so a setenv() in main() is too
// late): then only the atexit handler is installed, and fork() after a Client connected is
// unsupported. The child must not use any Client (or anything else of gRPC's) and should
// exec() or _exit() at once (every socket of the library is close-on-exec); until it does,
// it holds the parent's connection, so the parent's session and its leases outlive the
// parent. Forking before the first Client connects, and posix_spawn(), are safe either way.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensord/dlpack.h"
#include "tensord/status.h"
#include "tensord/types.h"  // the values the calls below take and give

namespace tensord {

namespace internal {
class LeaseView;
class SessionHolder;
class ClientPeer;
}  // namespace internal

// A held tensor: a lease plus a mapping of its memory. Move-only. Destroying it (or
// Release()) drops this handle's reference; DLPack views made from it keep their own.
class TENSORD_EXPORT TensorRef {
 public:
  TensorRef() = default;
  TensorRef(TensorRef&& other) noexcept;
  TensorRef& operator=(TensorRef&& other) noexcept;
  TensorRef(const TensorRef&) = delete;
  TensorRef& operator=(const TensorRef&) = delete;
  ~TensorRef();

  explicit operator bool() const { return view_ != nullptr; }
  const TensorInfo& info() const;
  uint64_t lease_id() const;
  // Element 0 (byte_offset applied); null for a zero-byte tensor's placeholder.
  const void* data() const;
  // Writable pointer: the producer's mapping of an allocated tensor, or a consumer's
  // private copy-on-write mapping. Null for a read-only view.
  void* mutable_data() const;
  bool readonly() const;

  // New DLPack views with their own reference. Never null for a valid TensorRef.
  DLManagedTensor* ToDLPack() const;
  DLManagedTensorVersioned* ToDLPackVersioned() const;

  // Drops this handle's reference now (the lease goes once no view holds it).
  void Release();

  // Device tensors (GPU memory): stream order between processes, with no host wait.
  // Makes `stream` wait for the producer's writes (the ready event its Publish recorded)
  // and adds it to the streams whose work must finish before this lease is released: when
  // the last reference (this handle or a DLPack view) goes, a "done" event is recorded on
  // each, and the client sends the release once they have completed, so the broker frees
  // or hands back the memory only after this process's kernels are through with it.
  // Acquire does this for AcquireOptions::stream, Take and TakeMany for the legacy default
  // stream. Call it for every further stream you use the tensor on, before queuing work
  // there. Does nothing for host tensors. Errors name the tensor and the driver's reason.
  Status UseOnStream(uintptr_t stream) const;
  // Device tensors, for a consumer that takes the memory with no stream (TensorFlow's
  // from_dlpack of a capsule): blocks this thread until the producer's writes are done.
  // Prefer UseOnStream, which never blocks the host. The release still waits only for the
  // streams given to UseOnStream. Does nothing for host tensors.
  Status WaitReadyOnHost() const;
  // A device tensor this client allocated: queues a copy of `bytes` from device memory at
  // `src` on the same device (a torch CUDA tensor's data_ptr(), say) into the tensor's
  // first bytes, on `stream`, without waiting for it. Publish with the same
  // PublishOptions::stream and consumers wait for the copy. INVALID_ARGUMENT for more
  // bytes than the tensor's extent or a null `src`; FAILED_PRECONDITION for a tensor that
  // is not this client's writable device tensor (host memory: memcpy into mutable_data()).
  Status CopyFromDevice(const void* src, uint64_t bytes, uintptr_t stream) const;

 private:
  friend class internal::SessionHolder;
  explicit TensorRef(internal::LeaseView* view) : view_(view) {}
  internal::LeaseView* view_ = nullptr;
};

// One element of Client::PublishMany: the tensor (which must outlive the call), its name,
// and the conditions for this element.
struct PublishItem {
  const TensorRef* tensor = nullptr;
  std::string name;
  PublishOptions options;
};

class Watcher;

class TENSORD_EXPORT Client {
 public:
  // Connects to the broker: opens the fd channel (the session) and the gRPC channel.
  // UNAVAILABLE with the socket path when no broker answers; PERMISSION_DENIED when the socket
  // directory fails the rule above (naming it, its owner and mode), when the daemon runs as a
  // uid that is neither root, us, nor a trusted one, or when the gRPC socket is not served by
  // the daemon on the fd channel (the same process, or the same uid where pids are not
  // visible): the session token is never sent to it. The client makes the gRPC connection
  // again when the broker closes it, and a new session when the broker ends the old one.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // A writable tensor in broker-owned memory; fill it through mutable_data(), then Publish.
  Result<TensorRef> Allocate(std::string_view ns, const TensorSpec& spec);
  // A bounded work queue, as Queue(maxsize) bounds one: a writable tensor that takes a slot
  // of the queue `prefix` (ending in '/'; its first segment is the namespace the tensor is
  // allocated in, so its buffer is recycled), waiting as options.wait says while
  // options.depth tensors are in the queue already (oldest waiter first). The tensor stays
  // in the queue until it is taken (or deleted, or its TTL unbinds it), or until it goes
  // without being published; publish it directly under `prefix` (QueueItemName gives a
  // unique name there), and consumers Take(prefix), oldest first. A full queue so holds its
  // producer back before any memory is made for it. Errors: INVALID_ARGUMENT (a prefix not
  // ending in '/', a depth of 0 or above 65536, a bad spec), RESOURCE_EXHAUSTED (full, with
  // Wait::None(); the session's or uid's cap of waits), DEADLINE_EXCEEDED (still full when
  // the wait ended), CANCELLED (options.cancel), and what Allocate answers.
  Result<TensorRef> AllocateInQueue(std::string_view prefix, const TensorSpec& spec,
                                    const QueueSlotOptions& options);
  // Registers a memfd the caller already has (sealed SHRINK|GROW here if it is not yet).
  Result<TensorRef> Export(int memfd, uint64_t offset, std::string_view ns,
                           const TensorSpec& spec);
  // Registers GPU memory this process already has, without copying it: `device_ptr` is
  // element 0 of a tensor laid out as `spec` says on `spec.device` (kDLCUDA, this process's
  // ordinal), e.g. a torch CUDA tensor's data_ptr(). Publish it as any other tensor.
  // CUDA: legacy IPC (cuIpcGetMemHandle) of the allocation that holds the pointer
  // (cuMemGetAddressRange), in the device's primary context; memory from cuMemAlloc /
  // cudaMalloc, as torch's caching allocator hands out, not VMM or pool allocations.
  //
  // OPT-IN: a consumer can reach the WHOLE allocation that holds `device_ptr`, not only the
  // tensor's bytes. With a caching allocator that is the rest of its segment: other tensors
  // of this process, also later ones placed there. Export only memory whose whole
  // allocation any consumer of the namespace may read and write (copy the tensor into an
  // allocation of its own, or use Allocate, when that is not so).
  //
  // Lifetime: the memory stays this process's; the broker cannot keep it alive, so the
  // client does. Pass the owner of the memory as `source` (e.g. a shared_ptr whose deleter
  // frees it or drops a torch tensor): the client keeps it until the broker reports that
  // no one holds the export any more (the tensor is unbound, by Delete, re-publish, take
  // or TTL, and every lease on it is released, yours included) and then drops its
  // reference, so you may drop the returned TensorRef right after Publish. The TensorRef
  // (it points at `device_ptr` itself; its info().device is spec.device) holds `source`
  // too, while it and its DLPack views live. The client drops `source` on its own release
  // thread (or in ~Client), never under a lock of its own and never inside another call of
  // yours, so its deleter may take your locks; it must not call this Client, whose release
  // thread it runs on. A fork child never drops its parent's sources. Without a `source`
  // nothing is kept for you: keep the memory alive until every consumer is done.
  // When the session ends before the broker says so (the broker hung up or restarted;
  // the client connects a new session on the next call), the sources of that session are
  // kept until the Client is destroyed: consumers may still have the memory mapped and no
  // one will report when they stop. Destroying the Client drops every source it keeps,
  // after closing its session: the broker then retires those tensors as for a producer
  // that exited (below), and a consumer that still has one mapped reads memory that may
  // have been freed or reused.
  // Order: Publish with PublishOptions::stream set to the stream your kernels wrote on;
  // consumers' streams wait for that work (no host sync needed).
  //
  // When this process exits, however it exits, the broker retires the tensor: its name is
  // unbound (watchers and holders hear it, as for a Delete) and acquiring it by id fails
  // with FAILED_PRECONDITION "tensor N: its producer (pid P, session S) exited; its memory
  // was the producer's". Consumers keep the leases they hold until they release them, and
  // a consumer that mapped it keeps its mapping, but on a real GPU the memory may be gone
  // with the process: reading it then is undefined. This process cannot Acquire its own
  // export (a process cannot open its own CUDA IPC handle): use the returned TensorRef.
  //
  // Errors: INVALID_ARGUMENT (a bad spec, a null pointer, a tensor of no elements, a
  // pointer the driver does not know or on another device than spec.device, the tensor
  // reaching past the end of its allocation); UNIMPLEMENTED (spec.device is host memory:
  // export a memfd with Export; a device type this build cannot export); the driver's
  // error, naming cuIpcGetMemHandle, for memory it will not share; FAILED_PRECONDITION /
  // UNAVAILABLE (no such device here, no driver); and what Export answers from the broker.
  Result<TensorRef> ExportDevice(const void* device_ptr, std::string_view ns, const TensorSpec& spec,
                                 std::shared_ptr<const void> source = nullptr);
  // Seals the tensor against writes by anyone else and binds it to `name` (empty: unnamed).
  Result<TensorInfo> Publish(const TensorRef& tensor, std::string_view name,
                             const PublishOptions& options = {});
  // Publish without waiting for the broker: it writes the request and returns (a producer
  // loop then costs no round trip). Checks made here (an empty or foreign tensor, a closed
  // client) fail here; what the broker refuses (the name's conditions, its namespace, a
  // closed session) is reported by the next Flush(), which names each failed publish, as
  // is a publish the broker may never have seen because the session stream broke. The
  // stream keeps order: a later Acquire or Take of the name sees it.
  Status PublishNoWait(const TensorRef& tensor, std::string_view name,
                       const PublishOptions& options = {});

  Result<TensorRef> Acquire(std::string_view name, const AcquireOptions& options = {});
  Result<TensorRef> Acquire(TensorId id, const AcquireOptions& options = {});
  // Acquires and unbinds atomically. A name ending in '/' takes the oldest tensor under it.
  Result<TensorRef> Take(std::string_view name_or_prefix, Wait wait = {});
  Result<TensorRef> Take(std::string_view name_or_prefix, const TakeOptions& options);

  // Batches. A batch goes to the broker as one session-stream message and its replies come
  // back together, so it costs one round trip however long it is, and the buffers it maps
  // are fetched together. Results come in the order of the elements.
  // AllocateMany and AcquireMany are all or nothing: when any element fails, the leases the
  // batch was granted are released (queued, as a DLPack deleter does) and the error carries
  // that element's code, its index and name, and the reason.
  Result<std::vector<TensorRef>> AllocateMany(std::string_view ns,
                                              const std::vector<TensorSpec>& specs);
  Result<std::vector<TensorRef>> AllocateMany(const std::vector<AllocateItem>& items);
  // A publish cannot be taken back (the binding it replaced is retired): when an element
  // fails, the others the broker accepted stay published, and the error says how many.
  Result<std::vector<TensorInfo>> PublishMany(const std::vector<PublishItem>& items);
  // By name; every element waits as `options.wait` says, all at the same time.
  Result<std::vector<TensorRef>> AcquireMany(const std::vector<std::string>& names,
                                             const AcquireOptions& options = {});
  // A batch of a work queue: up to `max_count` (at most 4096) takes of one name or prefix,
  // oldest first. Waits as `wait` says for the first; the rest are what is bound already,
  // so it returns between 1 and max_count tensors (the takes cannot be undone, so this is
  // not all or nothing).
  Result<std::vector<TensorRef>> TakeMany(std::string_view name_or_prefix, size_t max_count,
                                          Wait wait = {});
  Result<std::vector<TensorRef>> TakeMany(std::string_view name_or_prefix, size_t max_count,
                                          const TakeOptions& options);

  // Lease hand-over: gives another process the tensor with no copy and no name, for a
  // tensor you hold a lease on (a taken batch, say) and must pass on. The broker holds the
  // tensor for the token from here on, not for this process: release `tensor` or exit at
  // any time after this returns. The receiver's Redeem turns the token into a lease of its
  // own, once; until then, or until `ttl` runs out (0: 60 s; at most an hour), the tensor
  // stays in broker memory, and a token nobody redeems in time leaves nothing behind. A
  // token made after a PublishNoWait follows that publish (one stream).
  // Errors: INVALID_ARGUMENT (an empty TensorRef, a TTL over an hour); FAILED_PRECONDITION
  // (not published yet: publish it, unnamed if you like; a TensorRef whose lease is another
  // session's: this client's earlier one, or a parent's inherited across fork(); memory
  // gone with its producer); RESOURCE_EXHAUSTED (this uid has
  // --max-leases-per-session hand-overs pending, or the memory they would hold alive passes
  // its --max-host-bytes-per-uid: until the token ends, the tensor's memory counts against
  // this uid, once however many tokens it has on the tensor).
  Result<HandOverToken> HandOver(const TensorRef& tensor, std::chrono::milliseconds ttl = std::chrono::milliseconds(0));
  // The receiving side of HandOver: a lease on the tensor, mapped as `options` say
  // (readonly, pinned, stream; wait and min_generation do not apply: a token is there or
  // not). The token is spent on success. NOT_FOUND when it was redeemed already, expired
  // or never made (or the broker restarted); PERMISSION_DENIED when this uid may not read
  // the tensor (the token stays redeemable); FAILED_PRECONDITION when its memory went with
  // its producer.
  Result<TensorRef> Redeem(std::string_view token, const AcquireOptions& options = {});
  // Ends hand-overs this uid made (from any of its processes) that are still pending: the
  // given tokens, or with none every one. Their tensors go when nothing else holds them,
  // and the memory stops counting against this uid. A token that is not this uid's pending
  // hand-over is counted in not_found. INVALID_ARGUMENT for more than 65,536 tokens
  // (nothing is cancelled).
  Result<CancelledHandOvers> CancelHandOvers(const std::vector<std::string>& tokens = {});

  Status Delete(std::string_view name, uint64_t if_generation = 0);
  // Every name under `prefix` (empty: all; "ns/" a namespace), in name order, however many:
  // read a page at a time (ListPage), so the answer never outgrows a gRPC message. Each page
  // is read as the names are at that moment: a name appears at most once, and one bound or
  // unbound while the pages are read is listed if it was bound when its page was read, so
  // the result is not a snapshot of one instant.
  Result<std::vector<TensorInfo>> List(std::string_view prefix = "");
  // One page of that listing, for callers that go through it as it comes: ask again with
  // the answer's next_page_token (and the same prefix) until it is empty. INVALID_ARGUMENT
  // for a page token that is not a name under `prefix`. A broker older than paging answers
  // the whole listing in one page.
  Result<TensorPage> ListPage(std::string_view prefix, const ListPageOptions& options = {});
  Result<TensorStat> Stat(std::string_view name);
  Result<TensorStat> Stat(TensorId id);
  Result<BrokerStatus> GetStatus(const StatusOptions& options = {});
  // Binding changes under `prefix`. With `initial`, first a kBound event for every current
  // binding, in name order, however many; a change meanwhile to a name those events have
  // not reached yet shows only in that name's own event (one unbound meanwhile: none).
  Result<std::unique_ptr<Watcher>> Watch(std::string_view prefix, bool initial = false);

  // Sends queued releases now and waits until the broker has them. Fails when a
  // PublishNoWait since the last Flush failed: the status has the first failure's code and
  // names the failed publishes (the first few, and how many).
  Status Flush();

  uint64_t session_id() const;
  const std::string& socket_path() const;

 private:
  friend class internal::ClientPeer;  // tests' view of a Client (tests/integration/client_peer.h)
  explicit Client(std::shared_ptr<internal::SessionHolder> holder);
  std::shared_ptr<internal::SessionHolder> holder_;
};

// A stream of binding changes under a prefix. Destroying it cancels the stream.
class TENSORD_EXPORT Watcher {
 public:
  virtual ~Watcher() = default;
  // The next event; nullopt when `timeout` passes first. UNAVAILABLE once the stream ends.
  virtual Result<std::optional<WatchEvent>> Next(std::chrono::milliseconds timeout) = 0;
  // Ends the stream; a Next() in progress returns CANCELLED.
  virtual void Cancel() = 0;
};

// The socket a client uses by default (see ClientOptions::socket_path).
TENSORD_EXPORT std::string DefaultClientSocketPath();

// The name of a dtype, as numpy, the Python package and tensorctl write it: "bool", "int8"
// .. "int64", "uint8" .. "uint64", "float16", "float32", "float64", "bfloat16", "complex64",
// "complex128". INVALID_ARGUMENT naming the field for a dtype tensord does not support
// ("dlpack dtype.code is 3: ...": another code or width, or lanes other than 1).
TENSORD_EXPORT Result<std::string> DTypeName(DLDataType dtype);
// The dtype a DTypeName names; INVALID_ARGUMENT naming the text and listing the names.
TENSORD_EXPORT Result<DLDataType> ParseDTypeName(std::string_view name);
// "creating", "sealed" or "retired": TensorInfo::state as Python's info dicts name it.
TENSORD_EXPORT const char* TensorStateName(TensorState state);

// A name for `tensor` in the work queue `prefix` (ending in '/'): the prefix and the
// tensor's id, zero-padded to 20 digits, unique in the broker as the id is. Takes of the
// prefix go oldest first by publish order whatever the names.
TENSORD_EXPORT std::string QueueItemName(std::string_view prefix, const TensorRef& tensor);

// The memory kinds this build knows, host first (also those whose backend it was built
// without: they can still be named). The views point at static storage.
TENSORD_EXPORT std::span<const MemoryKindInfo> MemoryKinds();
// The kind of a DLPack device type; nullptr for one tensord does not know.
TENSORD_EXPORT const MemoryKindInfo* FindMemoryKind(int32_t device_type);
// How users name a device of this process: "cpu", "cuda:1", "xpu:0", "cuda_host" (a pinned
// view); "device<type>:<id>" for a type tensord does not know.
TENSORD_EXPORT std::string DeviceName(DLDevice device);
// The device a user names: "cpu", "cuda" (device 0), "cuda:1", "xpu:0": a kind with memory
// of its own, by its device_prefix. INVALID_ARGUMENT naming the text and the forms it takes.
TENSORD_EXPORT Result<DLDevice> ParseDeviceName(std::string_view text);

// Process-wide: turns off abseil's lock-order (deadlock cycle) checks, which Debian's abseil
// runs on every mutex acquisition in the process, the client's and gRPC's, at the cost of a
// global lock each. A program that embeds the client and does not debug lock order (the
// Python module, at import) may call it once, before its first Connect.
TENSORD_EXPORT void DisableLockOrderChecks();

// Level Zero (kDLOneAPI tensors): the context this process opens Level Zero memory and
// events in, for one driver. Level Zero lets a command list use only memory and events of
// its own context, so a program with its own (a SYCL queue's native context, say) hands
// it over before its first Level Zero tensor; otherwise tensord makes a context of its
// own, and the program's command lists cannot use tensord's tensors or wait on their
// events. `ze_driver` and `ze_context` are a ze_driver_handle_t and a ze_context_handle_t
// from the same loader. FAILED_PRECONDITION once tensord has used another context of that
// driver in this process; UNIMPLEMENTED in a build without the level_zero backend.
TENSORD_EXPORT Status UseLevelZeroContext(void* ze_driver, void* ze_context);

}  // namespace tensord
