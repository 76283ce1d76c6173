// SessionHolder: what a tensord::Client is inside, the holder of its current Session. It owns
// the options and the current Session (the connection); connects a new Session when the
// broker hung up the old one or when this process is a fork child that has not used the
// client yet; keeps the sources of exports whose session was lost; takes part in the
// process hooks (fork and exit); and runs each call of the public API on the current
// Session (Call), turning the Session's results into the public types (Status, Result<T>,
// TensorRef). Every operation itself is the Session's (session.h).
//
// fork(): the process hooks (process_hooks.h: pthread_atfork handlers, registered once
// unless the program opted out with TENSORD_NO_PROCESS_HOOKS=1, see client.h) walk every
// live holder. `prepare` takes the registry lock and each holder's mutex so no holder is
// mid-swap at fork time, and has each Session drop every gRPC object so gRPC shuts down
// before fork() (see process_hooks.cc for why); in the parent the holders go on and
// reconnect gRPC on next use; in the child each holder closes its inherited fd-channel
// socket at once (so the parent's death releases the parent's leases while the child lives
// on), abandons the parent's Session without running its destructors (its gRPC objects and
// threads belong to the parent), and connects a NEW session on first use. Views inherited
// from the parent stay mapped and readable; dropping them frees them locally and sends
// nothing.
//
// Exit: the atexit hook (process_hooks.h) stops every live holder's release sender and
// closes its Session stream before static destructors run; later calls fail UNAVAILABLE.
//
// Lost sessions: the sources of exports (Client::ExportDevice) whose session ended before
// the broker released them are kept until the holder goes, then dropped after its Session
// is closed, under no lock.
//
// Thread-safe. Errors: tensord::Status, canonical codes: the Session's, or Session::Open's
// when no session can be had (UNAVAILABLE once the process is exiting). Call does not catch
// exceptions: the public API wraps it in Guard (status_util.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "client/plain_mutex.h"
#include "client/session.h"
#include "client/status_util.h"
#include "tensord/client.h"

namespace tensord::internal {

// options.socket_path, else common::DefaultClientSocketPath().
std::string ResolveSocketPath(const ClientOptions& options);

class SessionHolder {
 public:
  static Result<std::shared_ptr<SessionHolder>> Create(const ClientOptions& options);
  ~SessionHolder();
  SessionHolder(const SessionHolder&) = delete;
  SessionHolder& operator=(const SessionHolder&) = delete;

  // Runs `fn(Session&)` on the current session, connecting one if needed, and returns its
  // result as the public API does: absl::Status -> Status, absl::StatusOr<T> -> Result<T>,
  // a LeaseView* (or a vector of them) -> a TensorRef holding the view's reference. When
  // no session can be had, that error, and `fn` does not run.
  template <typename Fn>
  auto Call(Fn&& fn) {
    using Public = decltype(ToPublic(std::forward<Fn>(fn)(std::declval<Session&>())));
    absl::StatusOr<std::shared_ptr<Session>> session = CurrentSession();
    if (!session.ok()) return Public(FromAbsl(session.status()));
    return ToPublic(std::forward<Fn>(fn)(**session));
  }

  // A TensorRef's view (nullptr for an empty one), for the calls that take one.
  static LeaseView* ViewOf(const TensorRef& ref) { return ref.view_; }

  // 0 when no session can be had.
  uint64_t session_id();
  const std::string& socket_path() const { return socket_path_; }

  // The current session, connecting one if needed.
  absl::StatusOr<std::shared_ptr<Session>> CurrentSession();

  // Fork and exit hooks (see the header comment).
  // Takes the holder's mutex and suspends its Session (false: gRPC objects remain); one of
  // the two after-fork hooks gives the mutex back.
  bool LockForFork(std::chrono::steady_clock::time_point deadline) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_);
  void UnlockAfterForkInParent() ABSL_UNLOCK_FUNCTION(mu_);
  void ResetAfterForkInChild() ABSL_UNLOCK_FUNCTION(mu_);
  void ShutdownAtExit() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  SessionHolder(const ClientOptions& options, std::string socket_path)
      : options_(options), socket_path_(std::move(socket_path)) {}

  // The Session's results as the public API's (see Call).
  static Status ToPublic(const absl::Status& status) { return FromAbsl(status); }
  template <typename T>
  static Result<T> ToPublic(absl::StatusOr<T> result) {
    if (!result.ok()) return FromAbsl(result.status());
    return *std::move(result);
  }
  static Result<TensorRef> ToPublic(absl::StatusOr<LeaseView*> view);
  static Result<std::vector<TensorRef>> ToPublic(absl::StatusOr<std::vector<LeaseView*>> views);

  const ClientOptions options_;
  const std::string socket_path_;

  // A plain futex mutex, not absl::Mutex: the fork handlers lock it in the parent and
  // unlock it in the child, where waiter records of the parent's other threads would be
  // dangling. Held only briefly, and across connecting a new session.
  PlainMutex mu_;
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
  // Sources of exports whose session ended before the broker released them (the broker
  // hung up, the daemon restarted): consumers may still map that memory and nobody will
  // say when they stop, so they are kept until this holder goes.
  std::vector<std::shared_ptr<const void>> lost_session_sources_ ABSL_GUARDED_BY(mu_);
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tensord::internal
