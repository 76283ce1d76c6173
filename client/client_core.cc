#include "client/client_core.h"

#include <dlfcn.h>
#include <pthread.h>

#include <cstdlib>
#include <set>
#include <utility>

#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "client/watcher.h"
#include "common/socket_paths.h"
#include "common/status.h"

namespace tensord::internal {
namespace {

// Every live ClientCore, for the fork and exit hooks. Leaked on purpose so it outlives
// static destruction. std::mutex for the same reason as ClientCore::mu_.
struct Registry {
  std::mutex mu;
  std::set<ClientCore*> cores;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

// gRPC and fork(), as found with Debian's gRPC 1.51 (libgrpc.so.29):
//  - Without help, a forked child that makes a new channel and calls on it hangs: the
//    call never completes (gRPC's polling engine, timer and executor threads belong to
//    the parent). Verified with a child that acquires after fork: no reply, ever.
//  - GRPC_ENABLE_FORK_SUPPORT=1 alone changes nothing here: this build does not register
//    gRPC's own pthread_atfork handlers (GRPC_POSIX_FORK_ALLOW_PTHREAD_ATFORK is off), so
//    grpc_prefork() never runs.
//  - Calling grpc_prefork / grpc_postfork_parent / grpc_postfork_child ourselves from our
//    atfork handlers works, provided fork support is on (the variable, read at grpc_init:
//    set below in a library constructor unless the program set it) and no thread is inside
//    gRPC at fork time; otherwise gRPC logs "Other threads are currently calling into gRPC,
//    skipping fork() handlers" and the child cannot call. Our threads that wait inside gRPC
//    are the Session stream's reader and each Watcher's reader, so `prepare` closes the
//    stream and pauses the watchers first (they reopen after the fork; a watcher reports
//    RESET). The closed calls are destroyed only after fork(): destroying one hands work to
//    gRPC's executor, and grpc_prefork() then deadlocked joining that executor thread.
//    The EventEngine (a separate thread pool, timer manager and poller in 1.51) has its own
//    PrepareFork/PostforkParent/PostforkChild, driven the same way.
//  - Results (tests with a real daemon): without a Watcher, a child acquires and calls on a
//    new session every time (12/12); with a Watcher alive in the parent at fork time the
//    parent is fine (its watcher gets RESET and goes on) but the child's first call
//    sometimes never completes (about 1 run in 3) and fails by its deadline: not solved.
//    Another thread's RPC in flight at fork time also makes gRPC skip its handlers.
//  - TENSORD_GRPC_FORK_HOOKS=0 turns this off (the child then cannot make calls, but the
//    fd channel is still closed in the child, which is what releases the parent's leases).
// The three functions are exported by libgrpc but not declared in its public headers;
// they are looked up by their mangled names so a gRPC without them just loses this help.
using GrpcForkFn = void (*)();
struct GrpcForkHooks {
  GrpcForkFn prefork = nullptr;
  GrpcForkFn postfork_parent = nullptr;
  GrpcForkFn postfork_child = nullptr;
  // The EventEngine's thread pool, timer manager and poller (1.51 keeps a separate list
  // of "forkables"); absent in other versions, then skipped.
  GrpcForkFn ee_prepare = nullptr;
  GrpcForkFn ee_postfork_parent = nullptr;
  GrpcForkFn ee_postfork_child = nullptr;
};

const GrpcForkHooks& GetGrpcForkHooks() {
  static const GrpcForkHooks hooks = [] {
    GrpcForkHooks h;
    h.prefork = reinterpret_cast<GrpcForkFn>(::dlsym(RTLD_DEFAULT, "_Z12grpc_preforkv"));
    h.postfork_parent = reinterpret_cast<GrpcForkFn>(::dlsym(RTLD_DEFAULT, "_Z20grpc_postfork_parentv"));
    h.postfork_child = reinterpret_cast<GrpcForkFn>(::dlsym(RTLD_DEFAULT, "_Z19grpc_postfork_childv"));
    h.ee_prepare = reinterpret_cast<GrpcForkFn>(
        ::dlsym(RTLD_DEFAULT, "_ZN17grpc_event_engine12experimental11PrepareForkEv"));
    h.ee_postfork_parent = reinterpret_cast<GrpcForkFn>(
        ::dlsym(RTLD_DEFAULT, "_ZN17grpc_event_engine12experimental14PostforkParentEv"));
    h.ee_postfork_child = reinterpret_cast<GrpcForkFn>(
        ::dlsym(RTLD_DEFAULT, "_ZN17grpc_event_engine12experimental13PostforkChildEv"));
    const char* off = ::getenv("TENSORD_GRPC_FORK_HOOKS");
    if (h.prefork == nullptr || h.postfork_parent == nullptr || h.postfork_child == nullptr ||
        (off != nullptr && std::string_view(off) == "0")) {
      h = GrpcForkHooks();
    }
    if (h.ee_prepare == nullptr || h.ee_postfork_parent == nullptr ||
        h.ee_postfork_child == nullptr) {
      h.ee_prepare = h.ee_postfork_parent = h.ee_postfork_child = nullptr;
    }
    return h;
  }();
  return hooks;
}

__attribute__((constructor)) void EnableGrpcForkSupport() {
  ::setenv("GRPC_ENABLE_FORK_SUPPORT", "1", /*overwrite=*/0);
}

void PrepareFork() {
  Registry& r = GetRegistry();
  r.mu.lock();
  for (ClientCore* core : r.cores) core->LockForFork();
  const GrpcForkHooks& hooks = GetGrpcForkHooks();
  if (hooks.prefork != nullptr) hooks.prefork();
  if (hooks.ee_prepare != nullptr) hooks.ee_prepare();
}

void ParentAfterFork() {
  const GrpcForkHooks& hooks = GetGrpcForkHooks();
  if (hooks.ee_postfork_parent != nullptr) hooks.ee_postfork_parent();
  if (hooks.postfork_parent != nullptr) hooks.postfork_parent();
  Registry& r = GetRegistry();
  for (ClientCore* core : r.cores) core->UnlockAfterForkInParent();
  r.mu.unlock();
}

void ChildAfterFork() {
  const GrpcForkHooks& hooks = GetGrpcForkHooks();
  if (hooks.ee_postfork_child != nullptr) hooks.ee_postfork_child();
  if (hooks.postfork_child != nullptr) hooks.postfork_child();
  Registry& r = GetRegistry();
  for (ClientCore* core : r.cores) core->ResetAfterForkInChild();
  r.mu.unlock();
}

void ShutdownAllAtExit() {
  std::vector<ClientCore*> cores;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (ClientCore* core : r.cores) core->ShutdownAtExit();
}

void InstallProcessHooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    GetGrpcForkHooks();  // resolved now, not inside a fork handler
    pthread_atfork(&PrepareFork, &ParentAfterFork, &ChildAfterFork);
    std::atexit(&ShutdownAllAtExit);
  });
}

Status AnnotatedFromAbsl(const absl::Status& status) { return FromAbsl(status); }

}  // namespace

std::string ResolveSocketPath(const ClientOptions& options) {
  return options.socket_path.empty() ? common::DefaultClientSocketPath() : options.socket_path;
}

Result<std::shared_ptr<ClientCore>> ClientCore::Create(const ClientOptions& options) {
  std::shared_ptr<ClientCore> core(new ClientCore(options, ResolveSocketPath(options)));
  absl::StatusOr<std::shared_ptr<Session>> session = Session::Open(options, core->socket_path_);
  if (!session.ok()) return FromAbsl(session.status());
  {
    std::lock_guard<std::mutex> lock(core->mu_);
    core->session_ = *std::move(session);
  }
  // After gRPC is initialised (Session::Open made a channel), so this atexit hook runs
  // before gRPC's own static destructors.
  InstallProcessHooks();
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.cores.insert(core.get());
  return core;
}

ClientCore::~ClientCore() {
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.cores.erase(this);
  }
  std::shared_ptr<Session> session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    session = std::move(session_);
  }
  // The Session's destructor stops its sender and closes the fd channel (the broker then
  // releases every lease of the session); views still held keep their mappings.
}

absl::StatusOr<std::shared_ptr<Session>> ClientCore::CurrentSession() {
  std::shared_ptr<Session> stale;  // destroyed outside the lock (it joins threads)
  std::lock_guard<std::mutex> lock(mu_);
  if (exiting_) return absl::UnavailableError("the process is exiting");
  if (session_ != nullptr && !session_->dead()) return session_;
  stale = std::move(session_);
  TENSORD_ASSIGN_OR_RETURN(session_, Session::Open(options_, socket_path_));
  return session_;
}

void ClientCore::LockForFork() {
  mu_.lock();
  if (session_ != nullptr) session_->QuiesceForFork();
}

void ClientCore::UnlockAfterForkInParent() {
  if (session_ != nullptr) session_->ResumeAfterFork();
  mu_.unlock();
}

void ClientCore::ResetAfterForkInChild() {
  if (session_ != nullptr) {
    session_->AbandonInForkedChild();
    // Never destroyed: its destructor would join threads and tear down gRPC objects that
    // belong to the parent.
    new std::shared_ptr<Session>(std::move(session_));
  }
  mu_.unlock();
}

void ClientCore::ShutdownAtExit() {
  std::shared_ptr<Session> session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    exiting_ = true;
    session = session_;
  }
  if (session != nullptr) session->ShutdownAtExit();
}

uint64_t ClientCore::session_id() {
  absl::StatusOr<std::shared_ptr<Session>> session = CurrentSession();
  return session.ok() ? (*session)->session_id() : 0;
}

#define TENSORD_SESSION_OR_RETURN(var)                                        \
  absl::StatusOr<std::shared_ptr<Session>> var##_or = CurrentSession();      \
  if (!var##_or.ok()) return AnnotatedFromAbsl(var##_or.status());            \
  std::shared_ptr<Session> var = *std::move(var##_or)

namespace {

Result<TensorRef> ToRef(absl::StatusOr<LeaseView*> view) {
  if (!view.ok()) return FromAbsl(view.status());
  return ClientCore::MakeRef(*view);
}

}  // namespace

Result<TensorRef> ClientCore::Allocate(std::string_view ns, const TensorSpec& spec) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToRef(session->Allocate(ns, spec));
}

Result<TensorRef> ClientCore::Export(int memfd, uint64_t offset, std::string_view ns,
                                     const TensorSpec& spec) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToRef(session->Export(memfd, offset, ns, spec));
}

Result<TensorInfo> ClientCore::Publish(const TensorRef& tensor, std::string_view name,
                                       const PublishOptions& options) {
  LeaseView* view = ViewOf(tensor);
  if (view == nullptr) return Status(StatusCode::kInvalidArgument, "publish: an empty TensorRef");
  TENSORD_SESSION_OR_RETURN(session);
  absl::StatusOr<TensorInfo> info = session->Publish(*view, name, options);
  if (!info.ok()) return FromAbsl(info.status());
  return *std::move(info);
}

Result<TensorRef> ClientCore::Acquire(const Session::Target& target, const AcquireOptions& options) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToRef(session->Acquire(target, options));
}

Result<TensorRef> ClientCore::Take(std::string_view name_or_prefix, Wait wait) {
  TENSORD_SESSION_OR_RETURN(session);
  return ToRef(session->Take(name_or_prefix, wait));
}

Status ClientCore::Delete(std::string_view name, uint64_t if_generation) {
  TENSORD_SESSION_OR_RETURN(session);
  tensord::v1::DeleteRequest request;
  request.set_name(std::string(name));
  request.set_if_generation(if_generation);
  tensord::v1::DeleteResponse response;
  auto context = session->NewContext();
  grpc::Status status = session->stub()->Delete(context.get(), request, &response);
  // Whatever the outcome, a cached lease of the name must ask the broker again.
  session->ForgetName(name);
  return FromGrpc(status);
}

Result<std::vector<TensorInfo>> ClientCore::List(std::string_view prefix) {
  TENSORD_SESSION_OR_RETURN(session);
  tensord::v1::ListRequest request;
  request.set_prefix(std::string(prefix));
  tensord::v1::ListResponse response;
  auto context = session->NewContext();
  grpc::Status status = session->stub()->List(context.get(), request, &response);
  if (!status.ok()) return FromGrpc(status);
  std::vector<TensorInfo> out;
  out.reserve(static_cast<size_t>(response.tensors_size()));
  for (const tensord::v1::TensorInfo& t : response.tensors()) {
    absl::StatusOr<ValidatedTensor> valid = ValidateTensorInfo(t, "list entry '" + t.name() + "'");
    if (!valid.ok()) return FromAbsl(valid.status());
    out.push_back(std::move(valid->info));
  }
  return out;
}

Result<TensorStat> ClientCore::Stat(const Session::Target& target) {
  TENSORD_SESSION_OR_RETURN(session);
  tensord::v1::StatRequest request;
  if (const std::string* name = std::get_if<std::string>(&target)) {
    request.set_name(*name);
  } else {
    request.set_tensor_id(std::get<uint64_t>(target));
  }
  tensord::v1::StatResponse response;
  auto context = session->NewContext();
  grpc::Status status = session->stub()->Stat(context.get(), request, &response);
  if (!status.ok()) return FromGrpc(status);
  absl::StatusOr<ValidatedTensor> valid = ValidateTensorInfo(response.tensor(), "stat");
  if (!valid.ok()) return FromAbsl(valid.status());
  TensorStat out;
  out.info = std::move(valid->info);
  for (const tensord::v1::LeaseHolder& h : response.holders()) {
    out.holders.push_back(ToPublicHolder(h));
  }
  return out;
}

Result<BrokerStatus> ClientCore::GetStatus() {
  TENSORD_SESSION_OR_RETURN(session);
  tensord::v1::StatusRequest request;
  tensord::v1::StatusResponse response;
  auto context = session->NewContext();
  grpc::Status status = session->stub()->Status(context.get(), request, &response);
  if (!status.ok()) return FromGrpc(status);
  return ToPublicStatus(response);
}

Result<std::unique_ptr<Watcher>> ClientCore::Watch(std::string_view prefix, bool initial) {
  TENSORD_SESSION_OR_RETURN(session);
  absl::StatusOr<std::unique_ptr<Watcher>> watcher = WatcherImpl::Start(session, prefix, initial);
  if (!watcher.ok()) return FromAbsl(watcher.status());
  return *std::move(watcher);
}

Status ClientCore::Flush() {
  TENSORD_SESSION_OR_RETURN(session);
  return FromAbsl(session->Flush());
}

}  // namespace tensord::internal
