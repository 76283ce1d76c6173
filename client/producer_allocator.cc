#include "client/producer_allocator.h"

#include <utility>

#include "client/cancel_state.h"
#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "common/names.h"
#include "common/status.h"

namespace tensord::internal {

ProducerAllocator::ProducerAllocator(bool allocate_ahead, RpcChannel& channel, LeaseAdopter& adopter,
                                     std::shared_ptr<ReleaseQueue> queue, FlushFn flush)
    : allocate_ahead_(allocate_ahead),
      channel_(channel),
      adopter_(adopter),
      queue_(std::move(queue)),
      flush_(std::move(flush)) {}

absl::StatusOr<tensord::v1::SessionRequest> ProducerAllocator::AllocateRequest(std::string_view ns,
                                                                               const TensorSpec& spec,
                                                                               std::string_view what) {
  absl::StatusOr<tensord::v1::TensorDesc> desc = SpecToDesc(spec);
  if (!desc.ok()) return Annotate(desc.status(), what);
  tensord::v1::SessionRequest request;
  tensord::v1::AllocateRequest* allocate = request.mutable_allocate();
  allocate->set_ns(std::string(ns));
  *allocate->mutable_desc() = *std::move(desc);
  allocate->set_isolated(spec.isolated);
  allocate->mutable_tags()->insert(spec.tags.begin(), spec.tags.end());
  return request;
}

absl::StatusOr<tensord::v1::SessionRequest> ProducerAllocator::BatchRequest(
    const AllocateItem& item, std::string_view what, std::vector<std::shared_ptr<Mapping>>& hold) const {
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionRequest request, AllocateRequest(item.ns, item.spec, what));
  // AllocateRequest validated the description; this is its layout.
  TENSORD_ASSIGN_OR_RETURN(common::TensorLayout layout, common::ValidateDesc(request.allocate().desc()));
  OfferRecycled(layout.extent, *request.mutable_allocate(), hold);
  return request;
}

void ProducerAllocator::OfferRecycled(uint64_t extent, tensord::v1::AllocateRequest& allocate,
                                      std::vector<std::shared_ptr<Mapping>>& hold) const {
  // The broker recycles buffers only within a namespace.
  if (allocate.ns().empty()) return;
  allocate.set_recyclable(true);
  RecycledBuffers::Candidates candidates = recycled_.For(allocate.ns(), extent);
  allocate.mutable_reuse_buffer_ids()->Add(candidates.buffer_ids.begin(), candidates.buffer_ids.end());
  hold.insert(hold.end(), std::make_move_iterator(candidates.held.begin()),
              std::make_move_iterator(candidates.held.end()));
}

void ProducerAllocator::KeepRecycled(std::string_view ns, const tensord::v1::AllocateResponse& response,
                                     const LeaseView& view) {
  if (response.recyclable() && view.mapping() != nullptr) {
    recycled_.Keep(response.tensor().buffer().buffer_id(), ns, view.mapping());
  }
}

absl::StatusOr<LeaseView*> ProducerAllocator::Allocate(std::string_view ns, const TensorSpec& spec) {
  const std::string what = "allocate in '" + std::string(ns) + "'";
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionRequest request, AllocateRequest(ns, spec, what));
  // AllocateRequest validated the description; this is its layout.
  TENSORD_ASSIGN_OR_RETURN(common::TensorLayout layout, common::ValidateDesc(request.allocate().desc()));
  const uint64_t class_bytes = AllocationPool::ClassBytes(ns, spec, layout.extent);
  if (class_bytes != 0) {
    if (LeaseView* pooled = AllocateFromPool(ns, class_bytes, request.allocate().desc(), layout, what)) {
      return pooled;
    }
  }
  // Recycling works within a namespace only, and so does allocating ahead.
  bool released_ahead = false;
  std::optional<NextAhead> next;
  if (allocate_ahead_ && !ns.empty()) {
    if (LeaseView* view = TakeAhead(request, layout.extent, what, released_ahead, next)) return view;
  }
  std::vector<std::shared_ptr<Mapping>> reusable;  // mapped until the answer is adopted
  absl::StatusOr<tensord::v1::SessionResponse> response =
      AllocateOnStream(ns, std::move(request), layout.extent, released_ahead, reusable);
  if (!response.ok()) return response.status();
  TENSORD_ASSIGN_OR_RETURN(LeaseView* view, AdoptAllocated(ns, *response, what));
  if (class_bytes != 0) pool_.NoteAllocated(ns, class_bytes);
  // A producer that gets recycled buffers is the steady kind: its next one is asked for now.
  if (next.has_value() && response->allocate().recyclable()) {
    SendAhead(std::move(next->key), std::move(next->request), layout.extent);
  }
  return view;
}

absl::StatusOr<LeaseView*> ProducerAllocator::AllocateInQueue(std::string_view prefix, const TensorSpec& spec,
                                                              const QueueSlotOptions& options) {
  const std::string what = "allocate in queue '" + std::string(prefix) + "'";
  if (!prefix.ends_with('/')) {
    return absl::InvalidArgumentError(what + ": a queue is a prefix ending in '/'");
  }
  const std::string_view ns = common::NamespaceOf(prefix);
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionRequest request, AllocateRequest(ns, spec, what));
  // AllocateRequest validated the description; this is its layout.
  TENSORD_ASSIGN_OR_RETURN(common::TensorLayout layout, common::ValidateDesc(request.allocate().desc()));
  tensord::v1::QueueSlot* slot = request.mutable_allocate()->mutable_queue();
  slot->set_prefix(std::string(prefix));
  slot->set_depth(options.depth);
  if (options.wait.forever()) {
    slot->set_forever(true);
  } else if (options.wait.millis() > 0) {
    slot->set_timeout_ms(static_cast<uint64_t>(options.wait.millis()));
  }
  std::vector<std::shared_ptr<Mapping>> reusable;  // mapped until the answer is adopted
  OfferRecycled(layout.extent, *request.mutable_allocate(), reusable);
  TENSORD_ASSIGN_OR_RETURN(tensord::v1::SessionResponse response,
                           channel_.StreamCall(std::move(request), RpcChannel::ReplyBound(options.wait),
                                               CancelState::Of(options.cancel)));
  return AdoptAllocated(ns, response, what);
}

absl::StatusOr<LeaseView*> ProducerAllocator::AdoptAllocated(std::string_view ns,
                                                             const tensord::v1::SessionResponse& response,
                                                             std::string_view what) {
  if (!response.has_allocate()) {
    return absl::InternalError(std::string(what) + ": the broker answered with something else");
  }
  TENSORD_ASSIGN_OR_RETURN(LeaseView* view,
                           adopter_.AdoptLease(response.allocate().lease_id(), response.allocate().tensor(), {},
                                               ViewKind::kProducer, "", what));
  KeepRecycled(ns, response.allocate(), *view);
  return view;
}

absl::StatusOr<tensord::v1::SessionResponse> ProducerAllocator::AllocateOnStream(
    std::string_view ns, tensord::v1::SessionRequest request, uint64_t extent, bool released_ahead,
    std::vector<std::shared_ptr<Mapping>>& hold) {
  OfferRecycled(extent, *request.mutable_allocate(), hold);
  absl::StatusOr<tensord::v1::SessionResponse> response = channel_.StreamCall(request, kCallTimeout);
  if (response.status().code() == absl::StatusCode::kResourceExhausted) {
    // Slots the pool keeps idle in this namespace may be what is missing (arena room, the
    // lease cap): without the pool they would not exist. Give them back, with every release
    // still queued (an allocation sent ahead for another key among them), and once the
    // broker has them, ask again.
    std::vector<uint64_t> idle = pool_.TakeAll(ns);
    if (!idle.empty() || released_ahead) {
      queue_->PushLeaseIds(idle);
      if (flush_().ok()) response = channel_.StreamCall(std::move(request), kCallTimeout);
    }
  }
  return response;
}

LeaseView* ProducerAllocator::TakeAhead(const tensord::v1::SessionRequest& request, uint64_t extent,
                                        std::string_view what, bool& released_ahead,
                                        std::optional<NextAhead>& next) {
  std::string key = AllocateAhead::KeyOf(request.allocate());
  if (std::optional<AllocateAhead::Entry> ahead = ahead_.Take(); ahead.has_value()) {
    if (ahead->key != key) {
      released_ahead = ReleaseAhead(*std::move(ahead));
    } else if (LeaseView* view = CollectAhead(*std::move(ahead), request, extent, what)) {
      return view;
    }
  }
  next = NextAhead{std::move(key), request};
  return nullptr;
}

LeaseView* ProducerAllocator::CollectAhead(AllocateAhead::Entry ahead, const tensord::v1::SessionRequest& request,
                                           uint64_t extent, std::string_view what) {
  absl::StatusOr<tensord::v1::SessionResponse> response = RpcChannel::Await(*ahead.call, kCallTimeout);
  // Collected: the call lets go of its stream now, not after the next one is sent (a fork
  // in between waits for every holder of a stream).
  ahead.call.reset();
  if (!response.ok() || !response->has_allocate()) return nullptr;
  // On failure AdoptLease gave the lease back; the plain Allocate then says what is wrong.
  absl::StatusOr<LeaseView*> view = adopter_.AdoptLease(response->allocate().lease_id(), response->allocate().tensor(),
                                                        {}, ViewKind::kProducer, "", what);
  if (!view.ok()) return nullptr;
  KeepRecycled(request.allocate().ns(), response->allocate(), **view);
  if (response->allocate().recyclable()) SendAhead(ahead.key, request, extent);
  return *view;
}

bool ProducerAllocator::ReleaseAhead(AllocateAhead::Entry ahead) {
  absl::StatusOr<tensord::v1::SessionResponse> response = RpcChannel::Await(*ahead.call, kCallTimeout);
  // A reply that does not come in time goes to the orphan handler, which releases it.
  if (!response.ok() || !response->has_allocate()) return false;
  queue_->PushLeaseIds({response->allocate().lease_id()});
  return true;
}

void ProducerAllocator::SendAhead(std::string key, tensord::v1::SessionRequest request, uint64_t extent) {
  std::vector<std::shared_ptr<Mapping>> held;
  OfferRecycled(extent, *request.mutable_allocate(), held);
  absl::StatusOr<std::unique_ptr<SessionStream::PendingCall>> call = channel_.StreamStart(std::move(request));
  // Not sent (the stream is closed or broke): the next Allocate asks as a plain one.
  if (!call.ok()) return;
  ahead_.Put(AllocateAhead::Entry{std::move(key), *std::move(call), std::move(held)});
}

LeaseView* ProducerAllocator::AllocateFromPool(std::string_view ns, uint64_t class_bytes,
                                               const tensord::v1::TensorDesc& desc,
                                               const common::TensorLayout& layout, std::string_view what) {
  AllocationPool::Next next = pool_.Take(ns, class_bytes);
  std::optional<AllocationPool::Entry> entry = std::move(next.entry);
  if (!entry && next.refill > 0) entry = RefillPool(ns, class_bytes, next.refill, what);
  if (!entry) return nullptr;
  // What the broker would have answered for this spec in this slot. The slot's bytes are
  // left as they are: a plain Allocate in an arena gives a reused slot's old bytes too.
  tensord::v1::TensorInfo tensor = std::move(entry->tensor);
  *tensor.mutable_desc() = desc;
  tensor.mutable_desc()->mutable_strides()->Assign(layout.strides.begin(), layout.strides.end());
  tensor.mutable_buffer()->set_extent(layout.extent);
  tensor.set_nbytes(layout.nbytes);
  absl::StatusOr<LeaseView*> view = adopter_.AdoptLease(entry->lease_id, tensor, {}, ViewKind::kProducer, "",
                                                        what, /*own=*/{}, /*described_here=*/true);
  // On failure AdoptLease gave the lease back; a plain Allocate then says what is wrong.
  return view.ok() ? *view : nullptr;
}

std::optional<AllocationPool::Entry> ProducerAllocator::RefillPool(std::string_view ns, uint64_t class_bytes,
                                                                   size_t count, std::string_view what) {
  TensorSpec slot;
  slot.dtype = dtypes::kUInt8;
  slot.shape = {static_cast<int64_t>(class_bytes)};
  absl::StatusOr<tensord::v1::SessionRequest> request = AllocateRequest(ns, slot, what);
  if (!request.ok()) return std::nullopt;
  std::vector<tensord::v1::SessionRequest> requests(count, *request);
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> replies =
      channel_.StreamCallMany(std::move(requests), kCallTimeout);
  // Failed elements hold nothing; when none was granted, the plain call reports the error.
  std::vector<AllocationPool::Entry> granted;
  for (absl::StatusOr<tensord::v1::SessionResponse>& reply : replies) {
    if (!reply.ok() || !reply->has_allocate()) continue;
    granted.push_back(AllocationPool::Entry{reply->allocate().lease_id(),
                                            std::move(*reply->mutable_allocate()->mutable_tensor())});
  }
  std::vector<uint64_t> release;
  std::optional<AllocationPool::Entry> mine = pool_.Refill(ns, class_bytes, std::move(granted), release);
  queue_->PushLeaseIds(release);
  return mine;
}

}  // namespace tensord::internal
