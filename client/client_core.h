// ClientCore: what a tensord::Client is inside. It owns the options and the current Session
// (the connection), connects a new Session when the broker hung up the old one or when
// this process is a fork child that has not used the client yet, and turns the Session's
// results into the public types (TensorRef, TensorInfo, Status).
//
// fork(): the process hooks (process_hooks.h: pthread_atfork handlers, registered once
// unless the program opted out with TENSORD_NO_PROCESS_HOOKS=1, see client.h) walk every
// live ClientCore. `prepare` takes the registry lock and each core's mutex so no core is
// mid-swap at fork time, and has each Session drop every gRPC object so gRPC shuts down
// before fork() (see process_hooks.cc for why); in the parent the cores go on and reconnect
// gRPC on next use; in the child each core closes its inherited fd-channel socket at once
// (so the parent's death releases the parent's leases while the child lives on), abandons
// the parent's Session without running its destructors (its gRPC objects and threads belong
// to the parent), and connects a NEW session on first use. Views inherited from the parent
// stay mapped and readable; dropping them frees them locally and sends nothing.
//
// Exit: the atexit hook (process_hooks.h) stops every live core's release sender and closes
// its Session stream before static destructors run; later calls fail UNAVAILABLE.
//
// Thread-safe. Errors: tensord::Status, canonical codes; nothing throws out of here.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "client/plain_mutex.h"
#include "client/session.h"
#include "tensord/client.h"

namespace tensord::internal {

// options.socket_path, else common::DefaultClientSocketPath().
std::string ResolveSocketPath(const ClientOptions& options);

class ClientCore {
 public:
  static Result<std::shared_ptr<ClientCore>> Create(const ClientOptions& options);
  ~ClientCore();
  ClientCore(const ClientCore&) = delete;
  ClientCore& operator=(const ClientCore&) = delete;

  Result<TensorRef> Allocate(std::string_view ns, const TensorSpec& spec);
  Result<TensorRef> Export(int memfd, uint64_t offset, std::string_view ns, const TensorSpec& spec);
  Result<TensorRef> ExportDevice(const void* device_ptr, std::string_view ns, const TensorSpec& spec,
                                 std::shared_ptr<const void> source);
  Result<TensorInfo> Publish(const TensorRef& tensor, std::string_view name,
                             const PublishOptions& options);
  Status PublishNoWait(const TensorRef& tensor, std::string_view name, const PublishOptions& options);
  Result<TensorRef> Acquire(const Session::Target& target, const AcquireOptions& options);
  Result<TensorRef> Take(std::string_view name_or_prefix, const TakeOptions& options);
  Result<std::vector<TensorRef>> AllocateMany(const std::vector<AllocateItem>& items);
  Result<std::vector<TensorInfo>> PublishMany(const std::vector<PublishItem>& items);
  Result<std::vector<TensorRef>> TakeMany(std::string_view name_or_prefix, size_t max_count,
                                          const TakeOptions& options);
  Result<std::vector<TensorRef>> AcquireMany(const std::vector<std::string>& names,
                                             const AcquireOptions& options);
  Result<HandOverToken> HandOver(const TensorRef& tensor, std::chrono::milliseconds ttl);
  Result<TensorRef> Redeem(std::string_view token, const AcquireOptions& options);
  Result<CancelledHandOvers> CancelHandOvers(const std::vector<std::string>& tokens);
  Status Delete(std::string_view name, uint64_t if_generation);
  Result<std::vector<TensorInfo>> List(std::string_view prefix);
  Result<TensorPage> ListPage(std::string_view prefix, const ListPageOptions& options);
  Result<TensorStat> Stat(const Session::Target& target);
  Result<BrokerStatus> GetStatus(const StatusOptions& options = {});
  Result<std::unique_ptr<Watcher>> Watch(std::string_view prefix, bool initial);
  Status Flush();

  uint64_t session_id();
  const std::string& socket_path() const { return socket_path_; }

  // The current session, connecting one if needed.
  absl::StatusOr<std::shared_ptr<Session>> CurrentSession();

  // TensorRef's private constructor, for the helpers in client_core.cc.
  static TensorRef MakeRef(LeaseView* view) { return TensorRef(view); }
  static LeaseView* ViewOf(const TensorRef& ref) { return ref.view_; }

  // Fork and exit hooks (see the header comment).
  // Takes the core's mutex and suspends its Session (false: gRPC objects remain); one of
  // the two after-fork hooks gives the mutex back.
  bool LockForFork(std::chrono::steady_clock::time_point deadline) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_);
  void UnlockAfterForkInParent() ABSL_UNLOCK_FUNCTION(mu_);
  void ResetAfterForkInChild() ABSL_UNLOCK_FUNCTION(mu_);
  void ShutdownAtExit() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ClientCore(const ClientOptions& options, std::string socket_path)
      : options_(options), socket_path_(std::move(socket_path)) {}

  const ClientOptions options_;
  const std::string socket_path_;

  // A plain futex mutex, not absl::Mutex: the fork handlers lock it in the parent and
  // unlock it in the child, where waiter records of the parent's other threads would be
  // dangling. Held only briefly, and across connecting a new session.
  PlainMutex mu_;
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
  // Sources of exports whose session ended before the broker released them (the broker
  // hung up, the daemon restarted): consumers may still map that memory and nobody will
  // say when they stop, so they are kept until this core goes.
  std::vector<std::shared_ptr<const void>> lost_session_sources_ ABSL_GUARDED_BY(mu_);
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tensord::internal
