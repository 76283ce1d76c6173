// Session: one connected tensord session and everything bound to it, composed of parts:
//  - the fd channel (fd_connection.h), whose life IS the session;
//  - RpcChannel (rpc_channel.h): the gRPC connection, the Session stream, calls in flight,
//    fork suspension, and whether the session is closing or dead;
//  - LeaseAdopter (lease_adopter.h): the leases the broker grants, made into views;
//  - ProducerAllocator (producer_allocator.h): how an Allocate is served (pooled slots, an
//    allocation sent ahead, recycled buffers, or a plain Allocate);
//  - ReleaseDispatcher (release_dispatcher.h): the release sender's sink, sending releases;
//  - QuietPublishes (quiet_publishes.h): failures of publishes sent without waiting.
// It owns what they share: the mapping cache, the lease cache (lease_cache.h), the export
// table, and the release queue and its sender thread. It implements every operation of the
// public API with them (Acquire/Take/Allocate/Publish here, their batches in
// session_batch.cc, exports in session_export.cc, hand-overs in session_hand_over.cc, the
// unary Broker calls in session_queries.cc) and handles the broker's pushes. Its owner
// (SessionHolder) only picks the current Session and converts the results to public types.
//
// Acquire/Take/Allocate/Export return a LeaseView holding one reference for the caller.
// The broker-facing work (validation, dedupe of leases on one tensor, fetching and mapping
// buffers) happens here.
//
// Stream order: a consumer's views (Acquire, AcquireMany and Redeem on
// AcquireOptions::stream; Take and TakeMany on kLegacyDefaultStream) are ordered on that
// stream before they are returned (LeaseAdopter::OrderOnStream: a device view's stream waits
// for the producer's writes and is one its release waits for; host views cost nothing), a
// lease-cache hit as much as a new lease. When ordering fails, every reference the call
// would have returned is given back and the error (naming the tensor and the driver's
// reason) returned.
//
// Exports of memory this process owns (ExportDevice with a source): the source is kept in
// the session's ExportTable until the broker pushes ExportReleased for it, and dropped on
// the sender thread under no lock. While one is kept, the sender keeps a Session stream
// open to hear the notice, and after a cache_reset (notices may have been lost) it asks
// the broker about each one (Stat by id: NOT_FOUND means freed; ids are never reused).
// TakeExportSources() hands the rest to the owner when the session is gone.
//
// Lifetime: shared_ptr-owned by SessionHolder, by calls in flight and by Watch streams
// (shared_from_this). Views outlive it: their ReleaseQueue is shared, and once this Session
// stops its sender, a view's last reference frees it inline. dead() turns true when the
// broker hangs up the fd channel; the owner then connects a new Session. Thread-safe.
//
// Errors of Open(): PERMISSION_DENIED for a socket directory the rule refuses
// (common/socket_paths.h), a daemon uid we do not trust, or a gRPC socket not served by the
// fd channel's daemon; UNAVAILABLE naming the socket when no broker answers.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/export_table.h"
#include "client/fd_connection.h"
#include "client/grpc_connection.h"
#include "client/lease_adopter.h"
#include "client/lease_cache.h"
#include "client/mapping_cache.h"
#include "client/producer_allocator.h"
#include "client/quiet_publishes.h"
#include "client/release_dispatcher.h"
#include "client/release_queue.h"
#include "client/rpc_channel.h"
#include "client/session_stream.h"
#include "common/tensor_desc.h"
#include "grpcpp/channel.h"
#include "tensord/client.h"
#include "tensord/v1/broker.grpc.pb.h"

namespace tensord::internal {

class Session final : public std::enable_shared_from_this<Session> {
 public:
  // Connects: socket directory check, fd channel (uid check, HELLO/WELCOME), gRPC connection
  // (peer check), Session stream, sender.
  static absl::StatusOr<std::shared_ptr<Session>> Open(const ClientOptions& options,
                                                       const std::string& socket_path);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  using Target = std::variant<std::string, uint64_t>;  // name or tensor id
  // Consumers: views ordered on their stream (see the header comment).
  absl::StatusOr<LeaseView*> Acquire(const Target& target, const AcquireOptions& options);
  absl::StatusOr<LeaseView*> Take(std::string_view name_or_prefix, const TakeOptions& options);
  // The producer's view of a new tensor, as the ProducerAllocator decides to serve it.
  absl::StatusOr<LeaseView*> Allocate(std::string_view ns, const TensorSpec& spec);
  absl::StatusOr<LeaseView*> AllocateInQueue(std::string_view prefix, const TensorSpec& spec,
                                             const QueueSlotOptions& options);
  // Exports (session_export.cc): a memfd the caller has, or device memory at a pointer it
  // has (Importer::ExportExisting of spec.device's type makes the handle; the producer's
  // view is the pointer itself, holding `source`).
  absl::StatusOr<LeaseView*> Export(int memfd, uint64_t offset, std::string_view ns,
                                    const TensorSpec& spec);
  absl::StatusOr<LeaseView*> ExportDevice(const void* device_ptr, std::string_view ns,
                                          const TensorSpec& spec, std::shared_ptr<const void> source);
  absl::StatusOr<TensorInfo> Publish(const LeaseView& view, std::string_view name,
                                     const PublishOptions& options);
  // Writes a quiet publish and returns: the broker answers only a failure, which the next
  // Flush() reports (quiet_publishes.h). When QuietPublishes::kMaxUnconfirmed are
  // unconfirmed (nothing else asked of the broker since), this one waits for its reply,
  // which confirms them all.
  absl::Status PublishNoWait(const LeaseView& view, std::string_view name,
                             const PublishOptions& options);

  // Batches, one Session-stream message each way (SessionStream::CallMany;
  // session_batch.cc). Buffers not mapped yet are fetched together (one FETCH_FD per 253).
  // Allocate and acquire are all or nothing: when any element fails, every lease the batch
  // was granted is released (queued, as a deleter does) and the error names the first
  // failing element (index and name) and the reason. A publish cannot be taken back: the
  // error says how many other elements were published.
  struct PublishTarget {
    const LeaseView* view = nullptr;
    std::string name;
    PublishOptions options;
  };
  absl::StatusOr<std::vector<LeaseView*>> AllocateMany(const std::vector<AllocateItem>& items);
  absl::StatusOr<std::vector<TensorInfo>> PublishMany(const std::vector<PublishTarget>& items);
  absl::StatusOr<std::vector<LeaseView*>> AcquireMany(const std::vector<std::string>& names,
                                                      const AcquireOptions& options);
  // Up to `max_count` takes of one name or prefix, pipelined: the first waits as `wait`
  // says, the others take only what is there already. Between 1 and max_count views.
  absl::StatusOr<std::vector<LeaseView*>> TakeMany(std::string_view name_or_prefix,
                                                   size_t max_count, const TakeOptions& options);
  static constexpr size_t kMaxTakeBatch = 4096;
  // Drops the arena mappings the session keeps (the session is dead or being closed).
  void ReleaseKeptMappings() { mappings_.ReleaseKept(); }
  // The sources of exports the broker has not released (the session is dead or being
  // closed); the caller decides when to drop them, under no lock of ours.
  std::vector<ExportTable::Source> TakeExportSources() { return exports_.TakeHeld(); }
  // Hand-overs (session_hand_over.cc), on the stream: a token follows this session's
  // publishes, quiet ones included. A view from another session is refused before anything
  // is sent (its lease id means nothing to this one).
  absl::StatusOr<HandOverToken> HandOver(const LeaseView& view, std::chrono::milliseconds ttl);
  absl::StatusOr<LeaseView*> Redeem(std::string_view token, const AcquireOptions& options);
  // Drops this client's cached lease of `name` (after a Delete or Take by us).
  void ForgetName(std::string_view name);
  absl::Status Flush();

  // Unary Broker calls (session_queries.cc), each its own gRPC call beside the stream. The
  // broker's answers are checked (a page that does not move the listing on is DATA_LOSS);
  // their errors are the broker's.
  absl::StatusOr<CancelledHandOvers> CancelHandOvers(const std::vector<std::string>& tokens);
  // Whatever the outcome, a cached lease of the name asks the broker again afterwards.
  absl::Status Delete(std::string_view name, uint64_t if_generation);
  absl::StatusOr<TensorPage> ListPage(std::string_view prefix, const ListPageOptions& options);
  absl::StatusOr<TensorStat> Stat(const Target& target);
  absl::StatusOr<BrokerStatus> GetStatus(const StatusOptions& options);
  // A Watch stream (watcher.h), which holds this Session.
  absl::StatusOr<std::unique_ptr<Watcher>> Watch(std::string_view prefix, bool initial);

  // One Broker call (rpc_channel.h); session_queries.cc and watcher.cc make theirs here.
  using RpcCall = RpcChannel::Call;
  absl::StatusOr<RpcCall> BeginCall(
      std::optional<std::chrono::milliseconds> timeout = RpcChannel::kDefaultCallTimeout,
      bool cancel_on_fork = false) {
    return channel_.BeginCall(timeout, cancel_on_fork);
  }
  // Whether the parent's fork() left this Session behind in this (child) process.
  bool forked_away() const { return channel_.forked_away(); }

  uint64_t session_id() const { return fd_->welcome().session_id(); }
  const std::string& socket_path() const { return socket_path_; }
  bool dead() const { return channel_.dead(); }

  // Process exit: stop the sender and close the stream; later calls fail UNAVAILABLE.
  void ShutdownAtExit();
  // Fork parent, around fork(): SuspendForFork() makes this session hold no gRPC object
  // at all, so gRPC shuts down completely and a child starts it afresh (gRPC's own fork
  // support does not survive a child using it; see process_hooks.cc). New calls wait; calls
  // made with cancel_on_fork (Watch streams) are cancelled and reopen after; the Session
  // stream is drained (no reply lost; interrupted waits are retried after the fork); then
  // it waits for the other calls in flight and drops the gRPC connection. Returns false if a
  // call was still in flight at `deadline` (gRPC then stays up and the fallback in
  // process_hooks.cc applies). ResumeAfterFork() lets calls go on; the connection (connected
  // and checked again) and the stream reopen on next use.
  bool SuspendForFork(std::chrono::steady_clock::time_point deadline) {
    // An allocation sent ahead is a call in flight on the stream: given up, its lease is
    // released, and the stream can go.
    allocator_.GiveUpAhead();
    return channel_.SuspendForFork(deadline);
  }
  void ResumeAfterFork() { channel_.ResumeAfterFork(); }
  // Fork child: close the inherited fd channel at once (so the parent's death releases its
  // leases even while this child lives on) and abandon, without running any destructor,
  // every thread (and any gRPC object left) of the parent's. The Session itself must then
  // be leaked.
  void AbandonInForkedChild() noexcept;

  LeaseCache& leases_for_test() { return leases_; }
  ExportTable& exports_for_test() { return exports_; }
  MappingCache& mappings_for_test() { return mappings_; }
  // The current gRPC connection (nullptr when there is none).
  std::shared_ptr<GrpcConnection> grpc_connection_for_test() { return channel_.connection_for_test(); }

 private:
  using Clock = ReleaseSink::Clock;
  static constexpr std::chrono::milliseconds kDefaultCallTimeout = RpcChannel::kDefaultCallTimeout;
  // While exports are kept, how often the sender checks that a stream is open to hear
  // their release.
  static constexpr std::chrono::seconds kExportStreamCheck{1};

  Session(const ClientOptions& options, std::string socket_path, std::unique_ptr<FdConnection> fd,
          std::shared_ptr<ReleaseQueue> queue);

  // A take cannot be undone: for a view kind with an importer of its own (pinned), fails
  // here when that importer cannot map in this process, and has the broker refuse, without
  // unbinding it, a tensor whose memory that importer does not map (TakeRequest.memory_type).
  absl::Status PrepareTake(ViewKind kind, const std::string& what, tensord::v1::TakeRequest& take) const;
  // Request builders shared by the single and the batch calls; `what` names the element.
  absl::StatusOr<tensord::v1::SessionRequest> PublishRequest(const LeaseView& view,
                                                             std::string_view name,
                                                             const PublishOptions& options,
                                                             std::string_view what) const;
  static tensord::v1::SessionRequest AcquireRequest(const Target& target,
                                                    const AcquireOptions& options);
  // TakeMany's `max_count` requests for `target`, the first waiting as `options` says;
  // INVALID_ARGUMENT outside 1..kMaxTakeBatch.
  absl::StatusOr<std::vector<tensord::v1::SessionRequest>> TakeRequests(const std::string& target,
                                                                        size_t max_count,
                                                                        const TakeOptions& options) const;
  // A lease a batch element was granted (lease_adopter.h).
  using Grant = LeaseAdopter::Grant;
  void OnPush(const tensord::v1::SessionResponse& push);
  void OnOrphan(const tensord::v1::SessionResponse& reply);
  // Sends an Export of what `request` names (a staged memfd or a device handle) as `desc`
  // in `ns` with `spec`'s tags, and adopts the producer's lease over `own`.
  // `source` (may be null) is kept in exports_ from the broker's reply on.
  absl::StatusOr<LeaseView*> RegisterExport(tensord::v1::ExportRequest request, std::string_view ns,
                                            tensord::v1::TensorDesc desc, const TensorSpec& spec,
                                            const OwnMemory& own, const std::string& what,
                                            ExportTable::Source source = nullptr);
  // Sender thread, each Tick (session_export.cc): drops the sources the broker released,
  // asks about the held ones after a cache_reset, keeps a stream open while any is held.
  // Returns when it next wants to run.
  Clock::time_point TickExports(Clock::time_point now);
  // Releases every held export the broker no longer knows (Stat by id: NOT_FOUND); marks
  // the table unsure again when it could not ask.
  void ReconcileExports();
  absl::Status CheckOpen() const { return channel_.CheckOpen(); }

  const std::string socket_path_;
  const std::unique_ptr<FdConnection> fd_;
  const std::shared_ptr<ReleaseQueue> queue_;

  MappingCache mappings_;
  LeaseCache leases_;
  ExportTable exports_;

  // Failed publishes sent without waiting, for the next Flush().
  QuietPublishes quiet_;

  // The gRPC connection, the Session stream, calls in flight, fork suspension; the
  // session's closing and dead flags. Its handlers use what is above, and allocator_
  // (recycled buffers): ~Session drops the stream before the members go.
  RpcChannel channel_;
  // Makes the views of granted leases.
  LeaseAdopter adopter_;
  // Pooled slots, the allocation sent ahead, recycled buffers; uses the two above.
  ProducerAllocator allocator_;

  // The sender's sink: releases what the lease cache does not keep; drives TickExports.
  ReleaseDispatcher releases_;

  // Last: started once everything above exists, stopped first.
  std::unique_ptr<ReleaseSender> sender_;
};

}  // namespace tensord::internal
