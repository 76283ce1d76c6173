#include "client/session_holder.h"

#include <cstdlib>
#include <utility>
#include <vector>

#include "client/process_hooks.h"
#include "common/socket_paths.h"
#include "common/status.h"

namespace tensord::internal {

std::string ResolveSocketPath(const ClientOptions& options) {
  return options.socket_path.empty() ? common::DefaultClientSocketPath() : options.socket_path;
}

Result<std::shared_ptr<SessionHolder>> SessionHolder::Create(const ClientOptions& given) {
  ClientOptions options = given;
  // Kept with the holder, so a session opened again (after a fork) trusts the same uids.
  if (options.trusted_daemon_uids.empty()) {
    absl::StatusOr<std::vector<uint32_t>> from_environment = common::TrustedDaemonUidsFromEnvironment();
    if (!from_environment.ok()) return FromAbsl(from_environment.status());
    options.trusted_daemon_uids = *std::move(from_environment);
  }
  std::shared_ptr<SessionHolder> holder(new SessionHolder(options, ResolveSocketPath(options)));
  absl::StatusOr<std::shared_ptr<Session>> session = Session::Open(options, holder->socket_path_);
  if (!session.ok()) return FromAbsl(session.status());
  {
    PlainMutexLock lock(&holder->mu_);
    holder->session_ = *std::move(session);
  }
  // After gRPC is initialised (Session::Open made a channel), so the atexit hook runs
  // before gRPC's own static destructors.
  JoinProcessHooks(holder.get());
  return holder;
}

SessionHolder::~SessionHolder() {
  LeaveProcessHooks(this);
  std::shared_ptr<Session> session;
  std::vector<std::shared_ptr<const void>> sources;
  {
    PlainMutexLock lock(&mu_);
    session = std::move(session_);
    sources = std::move(lost_session_sources_);
  }
  // A watcher or a call in flight may keep the Session a little longer; the arena mappings
  // it keeps go now.
  if (session != nullptr) {
    session->ReleaseKeptMappings();
    std::vector<std::shared_ptr<const void>> held = session->TakeExportSources();
    sources.insert(sources.end(), std::make_move_iterator(held.begin()), std::make_move_iterator(held.end()));
  }
  // The Session's destructor stops its sender and closes the fd channel (the broker then
  // releases every lease of the session and retires its exports); views still held keep
  // their mappings.
  session.reset();
  // Then the memory of exports still held goes, under no lock (a source may be user code).
  sources.clear();
}

absl::StatusOr<std::shared_ptr<Session>> SessionHolder::CurrentSession() {
  std::shared_ptr<Session> stale;  // destroyed outside the lock (it joins threads)
  PlainMutexLock lock(&mu_);
  if (exiting_) return absl::UnavailableError("the process is exiting");
  if (session_ != nullptr && !session_->dead()) return session_;
  stale = std::move(session_);
  if (stale != nullptr) {
    // A watcher may keep the dead session alive; its arena mappings are of no use any more.
    stale->ReleaseKeptMappings();
    // Moved, not dropped: nothing of a source runs under mu_.
    for (std::shared_ptr<const void>& source : stale->TakeExportSources()) {
      lost_session_sources_.push_back(std::move(source));
    }
  }
  TENSORD_ASSIGN_OR_RETURN(session_, Session::Open(options_, socket_path_));
  return session_;
}

bool SessionHolder::LockForFork(std::chrono::steady_clock::time_point deadline) {
  mu_.Lock();
  return session_ == nullptr || session_->SuspendForFork(deadline);
}

void SessionHolder::UnlockAfterForkInParent() {
  if (session_ != nullptr) session_->ResumeAfterFork();
  mu_.Unlock();
}

void SessionHolder::ResetAfterForkInChild() {
  if (session_ != nullptr) {
    session_->AbandonInForkedChild();
    // Never destroyed: its destructor would join threads and tear down gRPC objects that
    // belong to the parent.
    new std::shared_ptr<Session>(std::move(session_));
  }
  // The parent's memory, as are the sources the abandoned Session keeps: never dropped here.
  if (!lost_session_sources_.empty()) {
    new std::vector<std::shared_ptr<const void>>(std::move(lost_session_sources_));
  }
  mu_.Unlock();
}

void SessionHolder::ShutdownAtExit() {
  std::shared_ptr<Session> session;
  {
    PlainMutexLock lock(&mu_);
    exiting_ = true;
    session = session_;
  }
  if (session != nullptr) session->ShutdownAtExit();
}

uint64_t SessionHolder::session_id() {
  absl::StatusOr<std::shared_ptr<Session>> session = CurrentSession();
  return session.ok() ? (*session)->session_id() : 0;
}

Result<TensorRef> SessionHolder::ToPublic(absl::StatusOr<LeaseView*> view) {
  if (!view.ok()) return FromAbsl(view.status());
  return TensorRef(*view);
}

Result<std::vector<TensorRef>> SessionHolder::ToPublic(absl::StatusOr<std::vector<LeaseView*>> views) {
  if (!views.ok()) return FromAbsl(views.status());
  std::vector<TensorRef> refs;
  refs.reserve(views->size());
  for (LeaseView* view : *views) refs.push_back(TensorRef(view));
  return refs;
}

}  // namespace tensord::internal
