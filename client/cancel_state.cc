#include "client/cancel_state.h"

#include <algorithm>
#include <utility>

namespace tensord {

CancelToken::CancelToken() : CancelToken(nullptr, std::chrono::milliseconds(0)) {}

CancelToken::CancelToken(std::function<bool()> poll, std::chrono::milliseconds period)
    : state_(std::make_shared<internal::CancelState>(std::move(poll), period)) {}

CancelToken::~CancelToken() = default;

void CancelToken::Cancel() { state_->Cancel(); }

bool CancelToken::cancelled() const { return state_->cancelled(); }

namespace internal {

CancelState::CancelState(std::function<bool()> poll, std::chrono::milliseconds period)
    : poll_(std::move(poll)), period_(std::max(period, std::chrono::milliseconds(1))) {}

absl::Status CancelState::CancelledStatus() {
  return absl::CancelledError("the wait was cancelled by its CancelToken");
}

void CancelState::Cancel() {
  std::map<uint64_t, Hook> hooks;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_.load(std::memory_order_relaxed)) return;
    cancelled_.store(true, std::memory_order_release);
    hooks.swap(hooks_);
  }
  for (auto& [id, hook] : hooks) hook();
}

std::optional<std::chrono::milliseconds> CancelState::poll_period() const {
  if (!poll_) return std::nullopt;
  return period_;
}

bool CancelState::Poll() {
  if (cancelled()) return true;
  if (poll_ && poll_()) Cancel();
  return cancelled();
}

uint64_t CancelState::Register(Hook hook) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_.load(std::memory_order_relaxed)) {
      const uint64_t id = next_id_++;
      hooks_.emplace(id, std::move(hook));
      return id;
    }
  }
  hook();
  return 0;
}

void CancelState::Unregister(uint64_t id) {
  if (id == 0) return;
  absl::MutexLock lock(&mu_);
  hooks_.erase(id);
}

}  // namespace internal
}  // namespace tensord
