#include "client/process_hooks.h"

#include <dlfcn.h>
#include <pthread.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>

#include "client/session_holder.h"
#include "client/plain_mutex.h"
#include "grpc/grpc.h"

namespace tensord::internal {
namespace {

// Every live SessionHolder, for the fork and exit hooks. Leaked on purpose so it outlives
// static destruction. A PlainMutex for the same reason as SessionHolder::mu_.
struct Registry {
  PlainMutex mu;
  std::set<SessionHolder*> holders ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

// gRPC and fork(), as found with Debian's gRPC 1.51 (libgrpc.so.29):
//  - A child that inherits a live gRPC cannot use it: the polling engine's epoll set is
//    shared with the parent (events for the child's sockets wake the parent, which then
//    crashes on pointers that only exist in the child), and the timer and executor threads
//    are missing. gRPC's own fork support (GRPC_ENABLE_FORK_SUPPORT plus grpc_prefork /
//    grpc_postfork_*) is not enough: this build does not register those handlers, its
//    EventEngine fork hooks are empty, and with the handlers driven by hand a child forked
//    right after another one still crashed or hung (seen with torch DataLoader workers).
//  - What works every time: gRPC with no object left shuts itself down completely (its
//    threads joined; with the poll engine no fd survives either) and starts afresh on the
//    next channel, in the parent and in any child. So `prepare` makes every Session drop all of its gRPC objects
//    (Session::SuspendForFork: the Session stream drained without losing a reply, watch
//    streams cancelled and reopened after, unary calls waited for), then waits for
//    grpc_is_initialized() to turn false. The parent reconnects on its next call (a few
//    milliseconds); the child starts with a clean gRPC of its own.
//  - If gRPC stays up (the program uses gRPC itself, or a call is stuck past the
//    deadline), the handlers fall back to grpc_prefork / grpc_postfork_*, looked up by
//    their mangled names (exported but not declared in the public headers). A child may then
//    fail to reach the broker; the fd channel is still closed in it, which is what releases
//    the parent's leases. TENSORD_GRPC_FORK_HOOKS=0 turns the fallback off.
constexpr std::chrono::seconds kForkPrepareBudget{5};

using GrpcForkFn = void (*)();
struct GrpcForkHooks {
  GrpcForkFn prefork = nullptr;
  GrpcForkFn postfork_parent = nullptr;
  GrpcForkFn postfork_child = nullptr;
};

const GrpcForkHooks& GetGrpcForkHooks() {
  static const GrpcForkHooks hooks = [] {
    GrpcForkHooks h;
    h.prefork = reinterpret_cast<GrpcForkFn>(::dlsym(RTLD_DEFAULT, "_Z12grpc_preforkv"));
    h.postfork_parent = reinterpret_cast<GrpcForkFn>(::dlsym(RTLD_DEFAULT, "_Z20grpc_postfork_parentv"));
    h.postfork_child = reinterpret_cast<GrpcForkFn>(::dlsym(RTLD_DEFAULT, "_Z19grpc_postfork_childv"));
    const char* off = ::getenv("TENSORD_GRPC_FORK_HOOKS");
    if (h.prefork == nullptr || h.postfork_parent == nullptr || h.postfork_child == nullptr ||
        (off != nullptr && std::string_view(off) == "0")) {
      h = GrpcForkHooks();
    }
    return h;
  }();
  return hooks;
}

// False when the program opted out with TENSORD_NO_PROCESS_HOOKS=1 (client.h says what it
// gives up): then nothing here touches the environment or installs fork handlers. Set once,
// by the constructor below, before any thread of ours exists.
bool g_process_hooks = true;

// Read by gRPC when it initialises; a program's own settings win.
//  - GRPC_POLL_STRATEGY=poll: the epoll1 engine keeps its epoll fd open across a complete
//    shutdown, so a child would share the parent's epoll set; poll() keeps no kernel
//    state between calls (and costs nothing with the one connection a client has).
//  - GRPC_ENABLE_FORK_SUPPORT=1: for the fallback below.
// At load time, because gRPC reads them once, when the first channel initialises it.
__attribute__((constructor)) void ConfigureGrpcForFork() {
  const char* opt_out = ::getenv("TENSORD_NO_PROCESS_HOOKS");
  if (opt_out != nullptr && std::string_view(opt_out) == "1") {
    g_process_hooks = false;
    return;
  }
  ::setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
  ::setenv("GRPC_ENABLE_FORK_SUPPORT", "1", /*overwrite=*/0);
}

// Set by PrepareFork when gRPC could not be stopped and its own hooks ran instead.
bool g_grpc_hooks_ran = false;

bool WaitForGrpcShutdown(std::chrono::steady_clock::time_point deadline) {
  while (grpc_is_initialized() != 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// The fork handlers hold the registry's and every holder's mutex from prepare to the
// after-fork hooks, one lock per holder: the analysis tracks neither.
void PrepareFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Registry& r = GetRegistry();
  r.mu.Lock();
  const auto deadline = std::chrono::steady_clock::now() + kForkPrepareBudget;
  bool suspended = true;
  for (SessionHolder* holder : r.holders) suspended = holder->LockForFork(deadline) && suspended;
  g_grpc_hooks_ran = false;
  if (suspended && WaitForGrpcShutdown(deadline)) return;
  const GrpcForkHooks& hooks = GetGrpcForkHooks();
  if (hooks.prefork != nullptr) {
    hooks.prefork();
    g_grpc_hooks_ran = true;
  }
}

void ParentAfterFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // see PrepareFork
  const GrpcForkHooks& hooks = GetGrpcForkHooks();
  if (g_grpc_hooks_ran) hooks.postfork_parent();
  Registry& r = GetRegistry();
  for (SessionHolder* holder : r.holders) holder->UnlockAfterForkInParent();
  r.mu.Unlock();
}

void ChildAfterFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // see PrepareFork
  const GrpcForkHooks& hooks = GetGrpcForkHooks();
  if (g_grpc_hooks_ran) hooks.postfork_child();
  Registry& r = GetRegistry();
  for (SessionHolder* holder : r.holders) holder->ResetAfterForkInChild();
  r.mu.Unlock();
}

void ShutdownAllAtExit() {
  Registry& r = GetRegistry();
  PlainMutexLock lock(&r.mu);
  for (SessionHolder* holder : r.holders) holder->ShutdownAtExit();
}

void InstallProcessHooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (g_process_hooks) {
      GetGrpcForkHooks();  // resolved now, not inside a fork handler
      pthread_atfork(&PrepareFork, &ParentAfterFork, &ChildAfterFork);
    }
    // Kept with the opt-out: it changes nothing the program sees, and without it a Client
    // still alive at exit() would meet gRPC's static destructors.
    std::atexit(&ShutdownAllAtExit);
  });
}

}  // namespace

void JoinProcessHooks(SessionHolder* holder) {
  InstallProcessHooks();
  Registry& r = GetRegistry();
  PlainMutexLock lock(&r.mu);
  r.holders.insert(holder);
}

void LeaveProcessHooks(SessionHolder* holder) {
  Registry& r = GetRegistry();
  PlainMutexLock lock(&r.mu);
  r.holders.erase(holder);
}

}  // namespace tensord::internal
