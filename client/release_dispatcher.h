// ReleaseDispatcher: a session's ReleaseSink (release_queue.h): what becomes of the views
// whose last reference went and of bare lease ids to release. For each batch the lease
// cache decides which views it keeps (LeaseCache::Dispose); the others are released: a view
// whose device work its done fences cover is still pending (LeaseView's stream order) waits
// for a later Tick, the rest have their private arena pages discarded, their leases sent in
// Release messages on the Session stream, and are destroyed after it (a last munmap happens
// here). Ids it could not send (the stream is down) are sent with the next batch or Tick; a
// dead session sends nothing (closing the fd channel released everything). Each Tick also
// releases the cached leases whose linger passed, starts the linger of arena mappings no
// view uses any more (MappingCache::Sweep), and runs `tick_exports` (the Session's exports'
// housekeeping, session_export.cc), once.
//
// Thread-safety: its state belongs to the release sender's thread, with no lock:
// ProcessBatch() and Tick() run there only, DestroyAwaitingDone() once the sender stopped.
// Lifetime: a member of its Session, made after the parts it uses; it must outlive the
// sender's Stop().
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "client/lease_cache.h"
#include "client/lease_view.h"
#include "client/mapping_cache.h"
#include "client/release_queue.h"
#include "client/rpc_channel.h"

namespace tensord::internal {

class ReleaseDispatcher final : public ReleaseSink {
 public:
  // Returns when it next wants to run (max(): never).
  using TickFn = std::function<Clock::time_point(Clock::time_point now)>;

  ReleaseDispatcher(LeaseCache& leases, MappingCache& mappings, RpcChannel& channel,
                    TickFn tick_exports);
  ~ReleaseDispatcher() override;  // DestroyAwaitingDone()
  ReleaseDispatcher(const ReleaseDispatcher&) = delete;
  ReleaseDispatcher& operator=(const ReleaseDispatcher&) = delete;

  // ReleaseSink (sender thread).
  void ProcessBatch(std::vector<LeaseView*> views, std::vector<uint64_t> lease_ids) override;
  Clock::time_point Tick(Clock::time_point now) override;

  // Once the sender has stopped: waits for the device work on the views still waiting for
  // their done fences, and destroys them (closing the session releases their leases, not
  // before that work has finished).
  void DestroyAwaitingDone();

 private:
  // Releases the leases of views at refcount zero (cache decisions already made) and
  // destroys them.
  void ReleaseAndDestroy(std::vector<LeaseView*> views, std::vector<uint64_t> lease_ids);
  void SendReleases(std::vector<uint64_t> lease_ids);

  LeaseCache& leases_;
  MappingCache& mappings_;
  RpcChannel& channel_;
  const TickFn tick_exports_;

  // Sender thread only: ids whose release could not be sent yet (stream down).
  std::vector<uint64_t> unsent_release_ids_;
  // Views to release once the device work their done fences cover has finished.
  // Sender thread only; DestroyAwaitingDone() after it stopped.
  std::vector<LeaseView*> awaiting_done_;
};

}  // namespace tensord::internal
