#include "client/release_dispatcher.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"
#include "common/protocol_limits.h"

namespace tensord::internal {
namespace {

// Lease ids per Release message.
// Ids kept while the stream is down; beyond these, the oldest are dropped.
constexpr size_t kMaxUnsentReleases = size_t{1} << 20;

}  // namespace

ReleaseDispatcher::ReleaseDispatcher(LeaseCache& leases, MappingCache& mappings,
                                     RpcChannel& channel, TickFn tick_exports)
    : leases_(leases), mappings_(mappings), channel_(channel), tick_exports_(std::move(tick_exports)) {}

ReleaseDispatcher::~ReleaseDispatcher() { DestroyAwaitingDone(); }

void ReleaseDispatcher::DestroyAwaitingDone() {
  for (LeaseView* view : awaiting_done_) {
    view->WaitDoneFences();
    delete view;
  }
  awaiting_done_.clear();
}

void ReleaseDispatcher::ProcessBatch(std::vector<LeaseView*> views, std::vector<uint64_t> lease_ids) {
  const Clock::time_point now = Clock::now();
  const bool closing = channel_.closing();
  std::vector<LeaseView*> doomed;
  doomed.reserve(views.size());
  for (LeaseView* view : views) {
    if (leases_.Dispose(view, now, closing) == LeaseCache::Disposition::kRelease) {
      doomed.push_back(view);
    }
  }
  ReleaseAndDestroy(std::move(doomed), std::move(lease_ids));
}

void ReleaseDispatcher::ReleaseAndDestroy(std::vector<LeaseView*> views, std::vector<uint64_t> lease_ids) {
  // A consumer's device work on the tensor comes before its release, and so before
  // whatever the broker does once the lease is gone: views whose done fences are still
  // pending wait for a later Tick.
  std::erase_if(views, [this](LeaseView* view) {
    if (view->DoneFencesComplete()) return false;
    awaiting_done_.push_back(view);
    return true;
  });
  for (LeaseView* view : views) {
    // Before the release: once it is sent, the broker may reuse an arena slot.
    view->DiscardPrivateArenaPages();
    lease_ids.push_back(view->lease_id());
  }
  SendReleases(std::move(lease_ids));
  // The munmap of a last mapping happens here, on the sender thread, after the release.
  for (LeaseView* view : views) delete view;
}

void ReleaseDispatcher::SendReleases(std::vector<uint64_t> lease_ids) {
  if (!unsent_release_ids_.empty()) {
    lease_ids.insert(lease_ids.begin(), unsent_release_ids_.begin(), unsent_release_ids_.end());
    unsent_release_ids_.clear();
  }
  if (lease_ids.empty() || channel_.dead()) return;  // a dead session released everything
  absl::StatusOr<std::shared_ptr<SessionStream>> stream = channel_.Stream();
  size_t sent = 0;
  while (stream.ok() && sent < lease_ids.size()) {
    size_t n = std::min(common::kMaxReleaseBatch, lease_ids.size() - sent);
    tensord::v1::SessionRequest request;
    auto* release = request.mutable_release();
    for (size_t i = 0; i < n; ++i) release->add_lease_ids(lease_ids[sent + i]);
    if (!(*stream)->Send(std::move(request)).ok()) break;
    sent += n;
  }
  if (sent < lease_ids.size()) {
    size_t left = lease_ids.size() - sent;
    if (left > kMaxUnsentReleases) {
      spdlog::error("tensord: dropping {} unsent releases (the session stream is down)",
                    left - kMaxUnsentReleases);
      left = kMaxUnsentReleases;
    }
    unsent_release_ids_.assign(lease_ids.end() - static_cast<ptrdiff_t>(left), lease_ids.end());
  }
}

ReleaseSink::Clock::time_point ReleaseDispatcher::Tick(Clock::time_point now) {
  Clock::time_point next;
  std::vector<LeaseView*> expired = leases_.TakeExpired(now, &next);
  if (!awaiting_done_.empty()) {
    // Queried again here; those still pending go back to awaiting_done_.
    expired.insert(expired.end(), awaiting_done_.begin(), awaiting_done_.end());
    awaiting_done_.clear();
  }
  if (!expired.empty() || !unsent_release_ids_.empty()) ReleaseAndDestroy(std::move(expired), {});
  if (!unsent_release_ids_.empty()) next = std::min(next, now + std::chrono::milliseconds(100));
  // A GPU's work on a batch takes microseconds to milliseconds: poll often, never block.
  if (!awaiting_done_.empty()) next = std::min(next, now + std::chrono::microseconds(200));
  // After the views above went: a reader's arena mapping they were the last users of
  // starts its linger now. Every batch of destroyed views is followed by a Tick.
  next = std::min(next, mappings_.Sweep(now));
  return std::min(next, tick_exports_(now));
}

}  // namespace tensord::internal
