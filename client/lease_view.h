// LeaseView: this process's hold on one remote lease plus the mapping its data lives in.
// There is at most one LeaseView per (tensor, map mode) per session; every TensorRef and
// every DLPack view made from it holds one reference (in `state_`, atomic).
//
// Unref() is what DLPack deleters call: it never blocks, never allocates, never makes an
// RPC, and may run on any thread, also after the Client is gone or while the process exits.
// The last Unref() hands the view to its ReleaseQueue (a lock-free push); the release sender
// then decides whether the lease is kept in the lease cache or released, and destroys the
// view (which drops its mapping reference: munmap when it was the last).
//
// Until the sender has decided, the view is still indexed by its session's LeaseCache, and
// a lookup there (under the cache's mutex) may revive it: a get that repeats a get whose
// result was just dropped needs no round trip even before the sender ran. The reference
// count and an "on the release queue" bit share one atomic word, so the sender's decision
// (SettleQueued, under the same mutex) and a reviving lookup cannot both win, and a view
// is never on the queue twice.
//
// Stream order (device memory; common/memory/stream_order.h): UseOnStream() makes a stream
// wait for the producer's ready fence and remembers it; the last Unref() records a done
// fence on every stream remembered since the last one (a cuEventRecord each: no wait), and
// the release sender releases the lease only once DoneFencesComplete(). Host views have no
// stream order: none of this does anything for them, and their Unref() never locks.
//
// Fields are constant after construction, except state_ (atomic), next_in_queue, the
// lease-cache state (cache_), which only LeaseCache touches, under its mutex (through
// LeaseCache::CacheOf, which clang's analysis checks), and the stream fields, under
// streams_mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/mapping_cache.h"
#include "tensord/client.h"

namespace tensord::internal {

class ReleaseQueue;

// How a view maps its buffer; part of the view's identity.
enum class ViewKind : uint8_t {
  kPrivate,   // consumer, copy-on-write (MAP_PRIVATE)
  kReadOnly,  // consumer, readonly=true (MAP_SHARED, PROT_READ)
  kProducer,  // the producer's writable mapping (MAP_SHARED, PROT_READ|PROT_WRITE)
  kPinned,    // consumer, pinned=true: MAP_SHARED, PROT_READ, cuMemHostRegister'ed
};
common::MapMode MapModeOf(ViewKind kind);
// The view kind's own importer (MappingKey::view): CUDA_HOST for kPinned, else UNSPECIFIED.
tensord::v1::DeviceType ViewTypeOf(ViewKind kind);
// The kind AcquireOptions ask for: pinned (always read-only), else readonly or private.
ViewKind ConsumerViewKind(const AcquireOptions& options);
// A take's: pinned, else private.
ViewKind ConsumerViewKind(const TakeOptions& options);

class LeaseView {
 public:
  struct Params {
    TensorInfo info;
    uint64_t lease_id = 0;
    uint64_t session_id = 0;     // the session the lease belongs to
    ViewKind kind = ViewKind::kPrivate;
    std::shared_ptr<Mapping> mapping;  // null for a zero-byte tensor
    uint64_t offset_in_mapping = 0;    // buffer offset of the extent + byte_offset
    std::string cache_name;  // the name it was acquired by (lease-cache candidate), or empty
    // A copy-on-write view of a tensor in an arena: its slot in the buffer (whole pages).
    uint64_t arena_slot_offset = 0;
    uint64_t arena_slot_length = 0;  // 0: not in an arena, or not copy-on-write
    // A producer's pooled slot: the broker still has it as a plain slot, and Publish sends
    // `info`'s description with it.
    bool described_here = false;
    // The producer's ready fence, as the grant carried it (device tensors; may be empty),
    // and who recorded it (common::ReadyFence::source; empty: unknown).
    std::string ready_fence;
    std::string ready_fence_source;
  };
  // Starts with one reference, owned by the caller.
  LeaseView(Params params, std::shared_ptr<ReleaseQueue> queue);
  ~LeaseView();
  LeaseView(const LeaseView&) = delete;
  LeaseView& operator=(const LeaseView&) = delete;

  // Adds a reference; the caller must already hold one.
  void Ref() noexcept { state_.fetch_add(1, std::memory_order_relaxed); }
  // Adds a reference to a view its LeaseCache still indexes, also one at zero references
  // on its way to the release sender. Only under the cache's mutex.
  void Revive() noexcept { state_.fetch_add(1, std::memory_order_acq_rel); }
  // Drops a reference; the last one queues the view. Never blocks.
  void Unref() noexcept;
  uint64_t refs() const noexcept { return state_.load(std::memory_order_acquire) & ~kQueued; }
  // Only for a view the LeaseCache holds idle at zero references (no one else can see it).
  void ReviveFromIdle() noexcept { state_.store(1, std::memory_order_release); }
  // Marks the view as on the release queue (ReleaseQueue::Push does this).
  void MarkQueued() noexcept { state_.fetch_or(kQueued, std::memory_order_acq_rel); }
  // For whoever took the view off the release queue: clears the mark and says whether the
  // view is still unreferenced (true: it is the caller's to cache or destroy) or was revived
  // meanwhile (false: leave it; its next last Unref queues it again). Under the LeaseCache's
  // mutex while the cache may still index the view.
  bool SettleQueued() noexcept;

  const TensorInfo& info() const { return info_; }
  uint64_t tensor_id() const { return info_.tensor_id; }
  uint64_t lease_id() const { return lease_id_; }
  uint64_t session_id() const { return session_id_; }
  ViewKind kind() const { return kind_; }
  bool described_here() const { return described_here_; }
  // A pinned view is a read-only mapping too.
  bool readonly() const { return kind_ == ViewKind::kReadOnly || kind_ == ViewKind::kPinned; }
  // Element 0; a static non-null byte for a zero-byte tensor.
  uint8_t* data() const { return data_; }
  bool has_mapping() const { return mapping_ != nullptr; }
  const std::shared_ptr<Mapping>& mapping() const { return mapping_; }
  // Before the lease goes: a copy-on-write view of an arena tensor throws away this
  // process's private copies of its slot's pages. The arena mapping outlives the view, and
  // once the lease is gone the broker may put another tensor in the slot; without this, an
  // in-place write to this tensor would show through in that one. Only for the last view
  // of the tensor in its session (the release sender), never for a duplicate.
  void DiscardPrivateArenaPages() const;

  // Stream order. Whether the view's memory has any (device memory) at all.
  bool stream_ordered() const { return stream_order_ != nullptr; }
  // Makes `stream` wait for the producer's ready fence (if the grant carried one) and adds
  // it to the streams the last Unref() records done fences on. OK and nothing done for host
  // memory. Errors name the tensor.
  absl::Status UseOnStream(uintptr_t stream);
  // Blocks this thread until the producer's writes are done (the ready fence, if any), for
  // a consumer that takes the memory with no stream. Nothing for host memory.
  absl::Status WaitReadyOnHost();
  // The producer's side: a ready fence recorded on `stream` for Publish to send; empty for
  // host memory.
  absl::StatusOr<std::string> RecordReady(uintptr_t stream) const;
  // The producer's device copy into its tensor (TensorRef::CopyFromDevice).
  absl::Status CopyFromDevice(const void* src, uint64_t bytes, uintptr_t stream) const;
  // True when every done fence recorded so far has completed (always, with none).
  bool DoneFencesComplete();
  // Blocks until they have (shutdown paths).
  void WaitDoneFences();

  // Marked by a `retired` push: the lease is never cached once its last reference goes.
  void MarkRetired() noexcept { retired_.store(true, std::memory_order_release); }
  bool retired() const noexcept { return retired_.load(std::memory_order_acquire); }

  // Intrusive link for ReleaseQueue's lock-free stack.
  LeaseView* next_in_queue = nullptr;

 private:
  // Lease-cache state, guarded by the mutex of the LeaseCache indexing the view, which
  // reaches it only through LeaseCache::CacheOf (annotated with that mutex; the mutex of
  // another object cannot be named here).
  struct CacheState {
    std::string name;  // the name the view serves from the cache (Params::cache_name), or empty
    bool idle = false;  // cached at zero references, owned by the cache
    std::chrono::steady_clock::time_point idle_deadline{};
  };
  friend class LeaseCache;
  CacheState cache_;

  static constexpr uint64_t kQueued = uint64_t{1} << 63;
  // References in the low bits, kQueued while the view is on the release queue.
  std::atomic<uint64_t> state_{1};
  std::atomic<bool> retired_{false};
  const TensorInfo info_;
  const uint64_t lease_id_;
  const uint64_t session_id_;
  const ViewKind kind_;
  std::shared_ptr<Mapping> mapping_;
  uint8_t* data_ = nullptr;
  const uint64_t arena_slot_offset_;
  const uint64_t arena_slot_length_;
  const bool described_here_;
  const std::string ready_fence_;
  const std::string ready_fence_source_;
  const common::StreamOrder* const stream_order_;  // null: host memory
  absl::Mutex streams_mu_;
  std::vector<uintptr_t> use_streams_ ABSL_GUARDED_BY(streams_mu_);
  std::vector<std::unique_ptr<common::DoneFence>> done_fences_ ABSL_GUARDED_BY(streams_mu_);
  // The last Unref(): a done fence on each stream in use_streams_.
  void RecordDoneFences() noexcept;
  friend class ReleaseQueue;
  // Keeps the queue alive for the last Unref(), whenever that comes.
  std::shared_ptr<ReleaseQueue> queue_;
};

}  // namespace tensord::internal
