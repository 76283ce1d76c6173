// CancelState: what a tensord::CancelToken is inside (client.h says what it promises). Calls
// waiting under a token register a hook that asks the broker to drop their waits (the
// Session stream sends a CancelWaitsRequest for their seqs); Cancel() runs every hook
// registered, on its own thread, and marks the token so that later calls do not wait at
// all. Poll() runs the token's poll, on the thread that waits, and cancels when it says so.
//
// Thread-safe. The hooks run under no lock of ours and must not block; they may run after
// their call unregistered (Cancel() copied them first), so they hold nothing of the call's
// but values and weak references.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "tensord/client.h"

namespace tensord::internal {

class CancelState {
 public:
  using Hook = std::function<void()>;
  // `poll` may be empty (then `period` is not used).
  CancelState(std::function<bool()> poll, std::chrono::milliseconds period);
  CancelState(const CancelState&) = delete;
  CancelState& operator=(const CancelState&) = delete;

  // The state of an AcquireOptions::cancel / TakeOptions::cancel; null for none.
  static CancelState* Of(const CancelToken* token) { return token == nullptr ? nullptr : token->state_.get(); }
  // What a call cancelled by its token returns.
  static absl::Status CancelledStatus();

  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // How often a waiting thread calls Poll(); nullopt: it need not wake at all.
  std::optional<std::chrono::milliseconds> poll_period() const;
  // On the waiting thread, under no lock of the client: the token's poll, which cancels it
  // when it returns true. True when the token is cancelled.
  bool Poll();

  // Registers `hook` to run when the token is cancelled; returns the registration's id.
  // Cancelled already: runs `hook` here and returns 0.
  uint64_t Register(Hook hook);
  void Unregister(uint64_t id);

 private:
  const std::function<bool()> poll_;
  const std::chrono::milliseconds period_;
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Hook> hooks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::internal
