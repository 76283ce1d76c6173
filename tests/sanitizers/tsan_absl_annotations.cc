// ThreadSanitizer annotations for Debian's uninstrumented abseil.
//
// abseil annotates absl::Mutex for TSan (the ABSL_TSAN_MUTEX_* calls in mutex.cc) only
// when the library itself is compiled with -fsanitize=thread. Debian's libabsl is not, so
// TSan cannot see that a Mutex orders anything and reports every access a Mutex guards as
// a race, in our code and in gRPC's alike. Suppressing those reports would hide real races;
// instead this file gives TSan what abseil would have: linked into every executable of a
// TENSORD_SANITIZER=thread build (and exported to the shared libraries by a dynamic list),
// it interposes the absl::Mutex and absl::CondVar functions that change who holds a mutex,
// makes the same annotations abseil makes, and calls the library's own function, found
// with dlsym(RTLD_NEXT).
//
// Interposed: exactly the functions that take or drop a mutex and are not themselves called
// by another interposed one (inside libabsl_synchronization every such call goes through
// the PLT, so it would be annotated twice): Lock, Unlock, TryLock and their Reader forms,
// LockWhen / LockWhenWithDeadline and their Reader forms (the WithTimeout forms call the
// WithDeadline ones), Mutex::AwaitCommon (under Await, AwaitWithTimeout and
// AwaitWithDeadline), CondVar::WaitCommon (under every CondVar::Wait*), and ~Mutex.
// The constructor is inline in mutex.h and annotates itself.
// Not covered: absl::Notification, whose already-notified fast path is an atomic inside the
// library (tensord does not use it); Notify and the waits under a Mutex are covered.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"

#if !defined(__SANITIZE_THREAD__) && !(defined(__has_feature) && __has_feature(thread_sanitizer))
#error "tsan_absl_annotations.cc belongs only in a -fsanitize=thread build"
#endif
#if !ABSL_OPTION_USE_INLINE_NAMESPACE
#error "the mangled names below assume abseil's inline namespace (Debian builds it with one)"
#endif

namespace {

#define TENSORD_TSAN_STR2(x) #x
#define TENSORD_TSAN_STR(x) TENSORD_TSAN_STR2(x)

// Bit of Mutex::mu_ that says a writer holds it (kMuWriter in abseil's mutex.cc).
constexpr intptr_t kMuWriter = 0x0008;

// The library's definition of absl::<inline ns>::<rest>; aborts when there is none, so a
// changed abseil fails loudly instead of running without annotations.
void* Real(const char* rest) {
  const std::string ns = TENSORD_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = "_ZN4absl" + std::to_string(ns.size()) + ns + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_annotations: %s not found in abseil: %s\n", name.c_str(),
                 dlerror());
    std::abort();
  }
  return fn;
}

template <typename Fn>
Fn Lookup(const char* rest) {
  return reinterpret_cast<Fn>(Real(rest));
}

unsigned HowFlags(intptr_t mu_word) {
  return (mu_word & kMuWriter) != 0 ? 0 : __tsan_mutex_read_lock;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

using synchronization_internal::KernelTimeout;

Mutex::~Mutex() {
  static const auto real = Lookup<void (*)(Mutex*)>("5MutexD1Ev");
  __tsan_mutex_destroy(this, __tsan_mutex_not_static);
  real(this);
}

void Mutex::Lock() {
  static const auto real = Lookup<void (*)(Mutex*)>("5Mutex4LockEv");
  __tsan_mutex_pre_lock(this, 0);
  real(this);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLock() {
  static const auto real = Lookup<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
}

bool Mutex::TryLock() {
  static const auto real = Lookup<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  bool locked = real(this);
  __tsan_mutex_post_lock(
      this, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
}

bool Mutex::ReaderTryLock() {
  static const auto real = Lookup<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  constexpr unsigned kFlags = __tsan_mutex_read_lock | __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(this, kFlags);
  bool locked = real(this);
  __tsan_mutex_post_lock(this, kFlags | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
}

void Mutex::Unlock() {
  static const auto real = Lookup<void (*)(Mutex*)>("5Mutex6UnlockEv");
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  static const auto real = Lookup<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  __tsan_mutex_pre_unlock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_unlock(this, __tsan_mutex_read_lock);
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto real = Lookup<void (*)(Mutex*, const Condition&)>(
      "5Mutex8LockWhenERKNS0_9ConditionE");
  __tsan_mutex_pre_lock(this, 0);
  real(this, cond);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto real = Lookup<void (*)(Mutex*, const Condition&)>(
      "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  real(this, cond);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
}

// Holds the mutex on return whether or not the condition became true.
bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Lookup<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_mutex_pre_lock(this, 0);
  bool res = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, 0, 0);
  return res;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  static const auto real = Lookup<bool (*)(Mutex*, const Condition&, absl::Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  bool res = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
  return res;
}

// Await: drops the mutex (in whichever mode it is held), waits, takes it back.
bool Mutex::AwaitCommon(const Condition& cond, KernelTimeout t) {
  static const auto real = Lookup<bool (*)(Mutex*, const Condition&, KernelTimeout)>(
      "5Mutex11AwaitCommonERKNS0_9ConditionENS0_24synchronization_internal13KernelTimeoutE");
  const unsigned how = HowFlags(mu_.load(std::memory_order_relaxed));
  __tsan_mutex_pre_unlock(this, how);
  __tsan_mutex_post_unlock(this, how);
  __tsan_mutex_pre_lock(this, how);
  bool res = real(this, cond, t);
  __tsan_mutex_post_lock(this, how, 0);
  return res;
}

bool CondVar::WaitCommon(Mutex* mutex, KernelTimeout t) {
  static const auto real = Lookup<bool (*)(CondVar*, Mutex*, KernelTimeout)>(
      "7CondVar10WaitCommonEPNS0_5MutexENS0_24synchronization_internal13KernelTimeoutE");
  const unsigned how = HowFlags(mutex->mu_.load(std::memory_order_relaxed));
  __tsan_mutex_pre_unlock(mutex, how);
  __tsan_mutex_post_unlock(mutex, how);
  __tsan_mutex_pre_lock(mutex, how);
  bool res = real(this, mutex, t);
  __tsan_mutex_post_lock(mutex, how, 0);
  return res;
}

ABSL_NAMESPACE_END
}  // namespace absl
