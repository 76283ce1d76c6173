// LeaseAdopter: turns the leases the broker grants a session into LeaseViews. For each grant
// it validates the tensor's description, finds the view the session holds on the tensor
// already (one remote lease per tensor and view kind: the new lease goes back), else maps
// the buffer through the mapping cache (its handle fetched on the fd channel, or the memory
// the producer exported itself) and indexes a new view in the lease cache. A batch's buffers
// are fetched together first (one FETCH_FD per 253). Mappings of arenas are kept (the
// producer's for the session's life, a reader's for the linger), and so are a reader's of
// recycled buffers (for the linger); those of other dedicated buffers are not
// (RetentionFor). Whatever it does not adopt goes back to the broker: the lease id is
// queued on the release queue, as a deleter's release would be.
//
// A consumer's views are ordered on the caller's stream before the Session returns them
// (OrderOnStream): that is where a device view's stream starts to wait for the producer's
// writes, and where its release starts to wait for that stream.
//
// It owns nothing but constants: the fd channel, the mapping cache, the lease cache and the
// release queue it uses are its Session's, each thread-safe, so it is thread-safe too.
// Lifetime: a member of its Session, made after and destroyed before the parts it uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "client/fd_connection.h"
#include "client/lease_cache.h"
#include "client/lease_view.h"
#include "client/mapping_cache.h"
#include "client/release_queue.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::internal {

struct ValidatedTensor;  // tensor_convert.h

// What the producer of an export has of its buffer already, so the broker's handle is
// never fetched: the memfd it exported (mapped again here), or its own memory as it is
// (a device pointer: a process cannot import its own CUDA IPC handle).
struct OwnMemory {
  int memfd = -1;
  std::shared_ptr<Mapping> mapping;
};

// The producer's ready fence as a grant carried it (device tensors; empty otherwise).
struct GrantedFence {
  std::string_view bytes;
  uint64_t producer_session = 0;  // the session that recorded it (AcquireResponse.ready_fence_session)
  static GrantedFence Of(const tensord::v1::AcquireResponse& grant) {
    return GrantedFence{grant.ready_fence(), grant.ready_fence_session()};
  }
};

class LeaseAdopter {
 public:
  LeaseAdopter(FdConnection& fd, MappingCache& mappings, LeaseCache& leases,
               std::shared_ptr<ReleaseQueue> queue);
  LeaseAdopter(const LeaseAdopter&) = delete;
  LeaseAdopter& operator=(const LeaseAdopter&) = delete;

  // Builds (or finds) the view for a lease the broker just granted. On any failure the
  // lease is released. `described_here`: a pooled slot whose description `tensor` carries
  // is ours, not the broker's yet. `ready_fence`: the producer's, as the grant carried it.
  // `cache_name`: the name it was acquired by (the lease cache's key), or empty.
  absl::StatusOr<LeaseView*> AdoptLease(uint64_t lease_id, const tensord::v1::TensorInfo& tensor,
                                        GrantedFence ready_fence, ViewKind kind, std::string_view cache_name,
                                        std::string_view what, const OwnMemory& own = {},
                                        bool described_here = false);

  // A lease a batch element was granted.
  struct Grant {
    size_t index = 0;  // the element
    uint64_t lease_id = 0;
    const tensord::v1::TensorInfo* tensor = nullptr;
    GrantedFence ready_fence;  // the producer's, for device tensors (stream_order.h)
  };
  // Adopts every grant into views[grant.index] (buffers fetched together first). On the
  // first failure, gives back everything of the batch (the views adopted so far and the
  // grants not adopted yet) and returns the error, which `what` names. `cache_names`
  // (may be null): each element's cache_name, by index.
  absl::Status AdoptBatch(const std::vector<Grant>& grants, ViewKind kind,
                          const std::vector<std::string>* cache_names,
                          const std::function<std::string(size_t)>& what,
                          std::vector<LeaseView*>& views);
  // Gives back what a failed batch holds: a reference on each view, each bare lease id.
  void AbandonBatch(const std::vector<LeaseView*>& views, const std::vector<uint64_t>& lease_ids);

  // A consumer's views, before the caller gets them: device ones are ordered on `stream`
  // (LeaseView::UseOnStream: the stream waits for the producer's writes, and the release
  // for the stream); host ones have nothing to order and cost nothing. On failure every
  // view's reference is given back and the error, which names the tensor, returned.
  static absl::Status OrderOnStream(std::span<LeaseView* const> views, uintptr_t stream);
  // OrderOnStream for what a call returns: one view, or a batch's.
  static absl::StatusOr<LeaseView*> Ordered(absl::StatusOr<LeaseView*> view, uintptr_t stream);
  static absl::StatusOr<std::vector<LeaseView*>> Ordered(absl::StatusOr<std::vector<LeaseView*>> views,
                                                         uintptr_t stream);

 private:
  // Maps the buffers of `tensors` that are not mapped yet with one fetch (FETCH_FD per 253
  // buffers). Best effort: on failure nothing is returned and AdoptLease() maps (and
  // reports) each one itself. The result only keeps the mappings alive until adoption.
  std::vector<std::shared_ptr<Mapping>> PrefetchBuffers(
      const std::vector<const tensord::v1::TensorInfo*>& tensors, ViewKind kind);
  absl::StatusOr<std::shared_ptr<Mapping>> MapBuffer(const tensord::v1::TensorInfo& tensor,
                                                     ViewKind kind, int export_fd);
  // How long the mapping cache keeps a buffer's mapping: arenas are kept (the producer's
  // for the session's life, a reader's for the linger), a reader's of a recycled buffer for
  // the linger, other dedicated buffers not at all.
  static Retention RetentionFor(const tensord::v1::TensorInfo& tensor, ViewKind kind);
  // AdoptLease's steps. The mapping `valid`'s bytes are in (`own`'s, else MapBuffer's),
  // once it holds them (DATA_LOSS naming `what` otherwise); null for a tensor of no bytes.
  absl::StatusOr<std::shared_ptr<Mapping>> MapTensor(const tensord::v1::TensorInfo& tensor,
                                                     const ValidatedTensor& valid, ViewKind kind,
                                                     const OwnMemory& own, std::string_view what);
  // Names the device as this process does: its ordinal here, and the view's own device type
  // where the view is of another kind than the memory (pinned host memory).
  static void NameDeviceHere(const Mapping& mapping, TensorInfo& info);
  // Sets `params`' ready fence and, when a producer session recorded it, the broker's names
  // for the fence's process (its instance and that session).
  void SetReadyFence(GrantedFence ready_fence, LeaseView::Params& params) const;
  // Indexes a new view of `params` in the lease cache and returns the one it holds: ours,
  // or the view of another acquire of the tensor that won the race (ours given back).
  LeaseView* IndexView(LeaseView::Params&& params, uint64_t lease_id);
  MappingKey KeyFor(uint64_t buffer_id, ViewKind kind) const;

  FdConnection& fd_;
  const std::string instance_nonce_;  // the broker's, from the fd channel's welcome
  const uint64_t session_id_;
  MappingCache& mappings_;
  LeaseCache& leases_;
  const std::shared_ptr<ReleaseQueue> queue_;
};

}  // namespace tensord::internal
