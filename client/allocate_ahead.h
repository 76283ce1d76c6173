// AllocateAhead: a Session's one Allocate sent ahead of the call that will want it
// (ClientOptions::allocate_ahead), so that a steady producer's next Allocate finds its
// buffer granted while it filled the last one, instead of waiting a round trip.
//
// After an Allocate in a namespace is granted a recyclable buffer, the Session sends the
// same request again at once (Put) and keeps the call here, keyed by the request (the
// namespace, description, tags and isolation: everything but the buffers it offers). The
// next Allocate with the same key collects the reply; one with another key releases the
// lease it was granted (the buffer goes to the producer's pool in the broker, as any
// released one does). A call given up uncollected (a fork, the session's end) is never
// lost either: its reply, whether it came or comes later, goes to the session stream's
// orphan handler, which releases the lease.
//
// Only the Session makes broker calls and matches keys; this keeps one call. Thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/mapping_cache.h"
#include "client/session_stream.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::internal {

class AllocateAhead {
 public:
  struct Entry {
    std::string key;
    std::unique_ptr<SessionStream::PendingCall> call;
    // The producer's mappings of the buffers the request offered, mapped until the answer
    // is adopted (as RecycledBuffers::Candidates::held).
    std::vector<std::shared_ptr<Mapping>> held;
  };

  // What two Allocates must share for one's reply to serve the other: `allocate` without
  // its offered buffers, serialized deterministically (tags are a map).
  static std::string KeyOf(const tensord::v1::AllocateRequest& allocate);

  // Keeps `entry`, giving up the one kept before (if any).
  void Put(Entry entry);
  // The kept call (nullopt: none), for the caller to collect, release or give up.
  std::optional<Entry> Take();

 private:
  absl::Mutex mu_;
  std::optional<Entry> kept_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::internal
