// ProducerAllocator: a Session's allocation strategy, how a producer's Allocate is served.
// For each Allocate it decides, in this order, between
//  - a pooled arena slot (allocation_pool.h): a small tensor in a namespace whose slot class
//    was allocated before; no round trip, Publish describes the slot;
//  - the allocation sent ahead (allocate_ahead.h, ClientOptions::allocate_ahead): the reply
//    of the same request sent when the last one was granted; one sent for another request
//    is released;
//  - a plain Allocate on the Session stream, offering the recycled buffers of the namespace
//    (recycled_buffers.h) the broker may hand back; a granted recyclable buffer's writable
//    mapping is kept for later ones, and, allocating ahead, the same request goes out again.
// When the broker answers RESOURCE_EXHAUSTED, the slots the pool keeps idle in the namespace
// (and an allocation sent ahead for another request) are given back, and once the broker
// has them (flush) the plain Allocate is asked once more. Batches (Session::AllocateMany)
// build their requests and keep their recycled buffers here too; they are never pooled or
// sent ahead.
//
// What it needs from its Session, all made before it and outliving it: the RpcChannel (the
// Session stream), the LeaseAdopter (a granted lease made into the producer's view; it gives
// back what it cannot adopt), the release queue (leases nobody will use), ClientOptions'
// allocate_ahead, and the Session's flush (queued releases sent and answered). It makes
// every broker call itself, never under a lock of its parts.
//
// Errors: what the broker or the adopter answers for the plain Allocate, the allocation
// named ("allocate in 'ns': ..."); INVALID_ARGUMENT for a spec refused before anything is
// sent. A pooled or ahead allocation that fails falls back to the plain one, which reports.
//
// Thread-safe: its parts each have their own mutex; it holds nothing else that changes.
// Fork: the allocation sent ahead is a call in flight on the stream, so GiveUpAhead() is
// called before fork() (and before the stream goes with the session); its lease, once
// granted, is released by the stream's orphan handler. Pooled slots and recycled buffers
// are leases and mappings of the session, gone with it; a fork child never touches them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "client/allocate_ahead.h"
#include "client/allocation_pool.h"
#include "client/lease_adopter.h"
#include "client/lease_view.h"
#include "client/mapping_cache.h"
#include "client/recycled_buffers.h"
#include "client/release_queue.h"
#include "client/rpc_channel.h"
#include "common/tensor_desc.h"
#include "tensord/client.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::internal {

class ProducerAllocator {
 public:
  // Sends every queued release and waits until the broker has them (Session::Flush).
  using FlushFn = std::function<absl::Status()>;

  ProducerAllocator(bool allocate_ahead, RpcChannel& channel, LeaseAdopter& adopter,
                    std::shared_ptr<ReleaseQueue> queue, FlushFn flush);
  ProducerAllocator(const ProducerAllocator&) = delete;
  ProducerAllocator& operator=(const ProducerAllocator&) = delete;

  // The producer's view of a new tensor of `spec` in `ns`, holding one reference.
  absl::StatusOr<LeaseView*> Allocate(std::string_view ns, const TensorSpec& spec);
  // The same in a slot of the bounded work queue `prefix` (in its namespace), waiting for
  // one as `options` says: never from the pool or sent ahead (neither holds a slot), but
  // offering the namespace's recycled buffers.
  absl::StatusOr<LeaseView*> AllocateInQueue(std::string_view prefix, const TensorSpec& spec,
                                             const QueueSlotOptions& options);

  // A batch element's Allocate (`what` names it), offering the namespace's recycled buffers;
  // their mappings go into `hold`, which the caller keeps until the answers are adopted.
  absl::StatusOr<tensord::v1::SessionRequest> BatchRequest(const AllocateItem& item, std::string_view what,
                                                           std::vector<std::shared_ptr<Mapping>>& hold) const;
  // The producer's view of an Allocate's answer in `ns`, with its recyclable buffer kept.
  absl::StatusOr<LeaseView*> AdoptAllocated(std::string_view ns, const tensord::v1::SessionResponse& response,
                                            std::string_view what);
  // After adopting `response` as `view`: keeps the writable mapping of a recyclable buffer.
  void KeepRecycled(std::string_view ns, const tensord::v1::AllocateResponse& response, const LeaseView& view);

  // The broker's pushes: it freed a recycled buffer; or pushes may have been lost
  // (cache_reset), so nothing kept is offered any more.
  void OnRecycledBufferFreed(uint64_t buffer_id) { recycled_.Forget(buffer_id); }
  void ForgetRecycled() { recycled_.ForgetAll(); }
  // Gives up the allocation sent ahead (before fork(), and before the session's stream goes).
  void GiveUpAhead() { (void)ahead_.Take(); }

 private:
  static constexpr std::chrono::milliseconds kCallTimeout = RpcChannel::kDefaultCallTimeout;

  // The next Allocate to send ahead once this one is granted a recyclable buffer.
  struct NextAhead {
    std::string key;
    tensord::v1::SessionRequest request;  // without offered buffers
  };

  // The Allocate request for `spec` in `ns`; `what` names it in errors.
  static absl::StatusOr<tensord::v1::SessionRequest> AllocateRequest(std::string_view ns,
                                                                     const TensorSpec& spec,
                                                                     std::string_view what);
  // In a namespace: asks for a recyclable buffer and names the kept ones of at least
  // `extent` bytes it may reuse; their mappings go into `hold`, which the caller keeps until
  // the answer is adopted (KeepRecycled).
  void OfferRecycled(uint64_t extent, tensord::v1::AllocateRequest& allocate,
                     std::vector<std::shared_ptr<Mapping>>& hold) const;
  // A view of a pooled slot of `class_bytes` described as `desc`, refilling the pool when it
  // is empty; nullptr when a plain Allocate must serve the call (the class is not pooled
  // yet or any more, or the refill or the adoption failed: the plain call then reports).
  LeaseView* AllocateFromPool(std::string_view ns, uint64_t class_bytes,
                              const tensord::v1::TensorDesc& desc,
                              const common::TensorLayout& layout, std::string_view what);
  // Allocates `count` slots of `class_bytes` in one batch; one for the caller,
  // the rest go into the pool.
  std::optional<AllocationPool::Entry> RefillPool(std::string_view ns, uint64_t class_bytes,
                                                  size_t count, std::string_view what);
  // ClientOptions::allocate_ahead, for `request` (of byte extent `extent`) in a namespace:
  // the view of the allocation sent ahead for it, or nullptr (none, or it failed: the plain
  // call then reports). One sent for another request is released (`released_ahead`).
  // `next` is what to send ahead after a plain Allocate.
  LeaseView* TakeAhead(const tensord::v1::SessionRequest& request, uint64_t extent, std::string_view what,
                       bool& released_ahead, std::optional<NextAhead>& next);
  // The view of `ahead`'s reply, with the next Allocate sent ahead; nullptr when it failed.
  // `request` is the Allocate it was sent for, without offered buffers; `extent` its byte
  // extent.
  LeaseView* CollectAhead(AllocateAhead::Entry ahead, const tensord::v1::SessionRequest& request,
                          uint64_t extent, std::string_view what);
  // An Allocate sent ahead that the next call does not want: its lease (once granted) goes
  // to the release queue. True when there was one to release.
  bool ReleaseAhead(AllocateAhead::Entry ahead);
  // Sends `request` ahead, offering the kept buffers of at least `extent` bytes, for the
  // next Allocate of `key`.
  void SendAhead(std::string key, tensord::v1::SessionRequest request, uint64_t extent);
  // The plain Allocate in `ns`, offering recycled buffers (their mappings into `hold`), asked
  // again once when idle pooled slots (or a released ahead allocation) may be what is missing.
  absl::StatusOr<tensord::v1::SessionResponse> AllocateOnStream(std::string_view ns,
                                                                tensord::v1::SessionRequest request,
                                                                uint64_t extent, bool released_ahead,
                                                                std::vector<std::shared_ptr<Mapping>>& hold);

  const bool allocate_ahead_;
  RpcChannel& channel_;
  LeaseAdopter& adopter_;
  const std::shared_ptr<ReleaseQueue> queue_;
  const FlushFn flush_;

  // Its leases go with the session; never released from a forked child.
  AllocationPool pool_;
  // Writable mappings of recyclable buffers, for later Allocates to reuse.
  RecycledBuffers recycled_;
  // The Allocate sent ahead; given up before the stream goes.
  AllocateAhead ahead_;
};

}  // namespace tensord::internal
