// PlainMutex: a std::mutex (a bare futex) that clang's thread-safety analysis knows as a
// capability, so ABSL_GUARDED_BY on it is checked. libstdc++'s std::mutex carries no such
// attributes, and an annotation naming one is checked by nothing. For the few locks that
// must not be absl::Mutex (see SessionHolder::mu_: locked in the parent before fork(), unlocked
// in the child); everything else uses absl::Mutex.
#pragma once

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace tensord::internal {

class ABSL_LOCKABLE PlainMutex {
 public:
  PlainMutex() = default;
  PlainMutex(const PlainMutex&) = delete;
  PlainMutex& operator=(const PlainMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds a PlainMutex for its scope, as absl::MutexLock does an absl::Mutex.
class ABSL_SCOPED_LOCKABLE PlainMutexLock {
 public:
  explicit PlainMutexLock(PlainMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~PlainMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  PlainMutexLock(const PlainMutexLock&) = delete;
  PlainMutexLock& operator=(const PlainMutexLock&) = delete;

 private:
  PlainMutex* const mu_;
};

}  // namespace tensord::internal
