// StreamOrder: how one memory kind orders work between processes on its devices, for
// memory that is written and read by work queued on streams (GPUs), with no host wait on
// the hot path. Host memory has none: its regions' stream_order() is null and every
// stream argument is ignored.
//
//  - Ready: the producer records a fence on the stream that wrote the tensor when it
//    publishes; the bytes go to the broker with the publish and come back to each acquirer
//    with its lease. A consumer makes its own stream wait on them before using the memory.
//  - Done: when a consumer's last reference to a lease goes, it records a fence on every
//    stream it used the tensor on, and its client sends the release only once those have
//    completed. So whatever follows a release (the broker freeing or reusing the memory, a
//    producer learning that its export is no longer held) comes after the consumer's work.
//
// Streams are the memory kind's own handles as integers. For CUDA that is a CUstream, and
// DLPack's stream numbers mean the same to the driver: 1 is the legacy default stream
// (CU_STREAM_LEGACY), 2 the per-thread default stream (CU_STREAM_PER_THREAD).
//
// An implementation lives at least as long as the regions that return it, and a
// DoneFence needs none of it (it may outlive every client): CUDA's order is one per
// process; Level Zero's is one per imported buffer, over its ready-event pool. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tensord::common {

// A ready fence as a consumer got it with its lease.
struct ReadyFence {
  std::string_view bytes;  // what the producer's RecordReady returned
  // Who recorded it, as the broker names the producer (its instance nonce and the
  // producer's session): equal sources are the same living process, which reuses its
  // fences. An order may keep what it opened of a fence under (source, bytes) for that
  // producer's later tensors; with an empty source it keeps nothing.
  std::string_view source;
};

// A fence this process recorded on one of its streams (RecordDone). Destroying it gives
// its resources back; it never blocks and never throws.
class DoneFence {
 public:
  virtual ~DoneFence() = default;
  // True once the work queued before the fence has finished. A fence the driver can no
  // longer answer for (a broken context) counts as done, with the reason logged: waiting
  // for it forever would hold the lease forever.
  virtual bool Complete() = 0;
  // Blocks until Complete() (shutdown paths only).
  virtual void Wait() = 0;
};

class StreamOrder {
 public:
  virtual ~StreamOrder() = default;
  // Records a ready fence on `stream` of device `ordinal` (this process's), after the work
  // queued there so far, and returns the bytes another process waits on. The fence stays
  // valid for as long as this process lives. Errors name `what`.
  virtual absl::StatusOr<std::string> RecordReady(int32_t ordinal, uintptr_t stream,
                                                  const std::string& what) const = 0;
  // Makes `stream` of device `ordinal` wait for a ready fence (from any process, this one
  // included) without a host wait. A fence whose producer has exited waits for nothing: its
  // process's work ended with it. INVALID_ARGUMENT for bytes that are not this kind's fence.
  virtual absl::Status WaitReady(const ReadyFence& fence, int32_t ordinal, uintptr_t stream,
                                 const std::string& what) const = 0;
  // Blocks this thread until the work the fence covers has finished: for a consumer that
  // takes memory with no stream at all (TensorFlow's from_dlpack of a capsule). The same
  // rules as WaitReady otherwise.
  virtual absl::Status WaitReadyOnHost(const ReadyFence& fence, int32_t ordinal, const std::string& what) const = 0;
  // Records a done fence on `stream` of device `ordinal`.
  virtual absl::StatusOr<std::unique_ptr<DoneFence>> RecordDone(int32_t ordinal, uintptr_t stream,
                                                                const std::string& what) const = 0;
  // Queues a copy of `bytes` from `src` to `dst`, both memory of this kind on device
  // `ordinal` (or reachable from it), on `stream`; returns without waiting for it.
  virtual absl::Status CopyOnStream(void* dst, const void* src, uint64_t bytes, int32_t ordinal, uintptr_t stream,
                                    const std::string& what) const = 0;
  // Copies `bytes` of this kind's memory at `src` on device `ordinal` to host memory at
  // `host` (any host memory: a plain mapping, not necessarily pinned), or the other way,
  // and returns once the bytes are at their destination: the thread blocks, and no stream
  // of the caller is involved. For staging a tensor through host memory (a tensor that
  // crosses nodes). UNIMPLEMENTED where a kind has no such copy.
  virtual absl::Status CopyToHost(void* host, const void* src, uint64_t bytes, int32_t ordinal,
                                  const std::string& what) const = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* host, uint64_t bytes, int32_t ordinal,
                                    const std::string& what) const = 0;
};

}  // namespace tensord::common
