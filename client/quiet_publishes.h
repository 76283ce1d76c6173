// QuietPublishes: a session's record of its publishes sent without waiting (PublishNoWait:
// quiet requests on the Session stream, session_stream.h). The broker answers one only if
// it fails; the stream hands each failure (or loss) to OnFailure(), and the next Flush()
// reports them all as one error through Report(), which forgets them.
//
// It owns that record only: the first kKeptFailures failures and how many there were. How
// many are unconfirmed is the stream's count (SessionStream::quiet_in_flight()); HasRoom()
// says whether it leaves room for one more (kMaxUnconfirmed), else the publish waits for its
// reply, which confirms every quiet one before it.
//
// Thread-safe (one mutex, held only to record or take the failures). Owned by the Session;
// it must outlive every stream whose failures it records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/session_stream.h"

namespace tensord::internal {

class QuietPublishes {
 public:
  // Quiet publishes a stream may have unconfirmed (nothing else asked of the broker since).
  static constexpr size_t kMaxUnconfirmed = 4096;
  // Failures kept for the report; the others are only counted.
  static constexpr size_t kKeptFailures = 8;

  QuietPublishes() = default;
  QuietPublishes(const QuietPublishes&) = delete;
  QuietPublishes& operator=(const QuietPublishes&) = delete;

  // Whether another publish may be sent quietly on `stream`.
  static bool HasRoom(SessionStream& stream) { return stream.quiet_in_flight() < kMaxUnconfirmed; }
  // A quiet publish failed or was lost (the stream's quiet-failure handler).
  void OnFailure(absl::Status failure);
  // The failures recorded since the last report, as one error with the first one's code
  // ("flush: ..."); OK when there were none.
  absl::Status Report();

 private:
  absl::Mutex mu_;
  std::vector<absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tensord::internal
