#include "client/lease_view.h"

#include "client/release_queue.h"
#include "common/check.h"
#include "common/logging.h"

namespace tensord::internal {
namespace {

// What data() points at for a zero-byte tensor: DLPack wants a non-null pointer.
alignas(64) uint8_t zero_byte_placeholder[64];

}  // namespace

common::MapMode MapModeOf(ViewKind kind) {
  switch (kind) {
    case ViewKind::kPrivate: return common::MapMode::kPrivate;
    case ViewKind::kReadOnly: return common::MapMode::kSharedReadOnly;
    case ViewKind::kProducer: return common::MapMode::kSharedWritable;
    case ViewKind::kPinned: return common::MapMode::kSharedReadOnly;
  }
  return common::MapMode::kPrivate;
}

tensord::v1::DeviceType ViewTypeOf(ViewKind kind) {
  return kind == ViewKind::kPinned ? tensord::v1::DEVICE_TYPE_CUDA_HOST : tensord::v1::DEVICE_TYPE_UNSPECIFIED;
}

ViewKind ConsumerViewKind(const AcquireOptions& options) {
  if (options.pinned) return ViewKind::kPinned;
  return options.readonly ? ViewKind::kReadOnly : ViewKind::kPrivate;
}

LeaseView::LeaseView(Params params, std::shared_ptr<ReleaseQueue> queue)
    : cache_name(std::move(params.cache_name)),
      info_(std::move(params.info)),
      lease_id_(params.lease_id),
      session_id_(params.session_id),
      kind_(params.kind),
      mapping_(std::move(params.mapping)),
      arena_slot_offset_(params.arena_slot_offset),
      arena_slot_length_(params.arena_slot_length),
      described_here_(params.described_here),
      queue_(std::move(queue)) {
  TENSORD_CHECK(queue_ != nullptr);
  if (mapping_ != nullptr) {
    TENSORD_CHECK(params.offset_in_mapping <= mapping_->size());
    data_ = mapping_->data() + params.offset_in_mapping;
  } else {
    data_ = zero_byte_placeholder;
  }
}

LeaseView::~LeaseView() = default;

void LeaseView::DiscardPrivateArenaPages() const {
  if (mapping_ == nullptr || arena_slot_length_ == 0) return;
  absl::Status discarded = mapping_->DiscardPrivatePages(arena_slot_offset_, arena_slot_length_);
  // Not fatal to the release; the slot's next tensor may then show our writes here.
  if (!discarded.ok()) {
    spdlog::warn("tensord: tensor {}: {}", info_.tensor_id, discarded.ToString());
  }
}

void LeaseView::Unref() noexcept {
  const uint64_t before = state_.fetch_sub(1, std::memory_order_acq_rel);
  TENSORD_CHECK((before & ~kQueued) > 0);
  if (before != 1) return;  // still referenced, or already on the queue (its sender decides)
  // Unreferenced and not queued: queue it, unless a lookup revived it in between.
  uint64_t expected = 0;
  if (state_.compare_exchange_strong(expected, kQueued, std::memory_order_acq_rel)) {
    ReleaseQueue::Push(this);
  }
}

bool LeaseView::SettleQueued() noexcept {
  uint64_t state = state_.load(std::memory_order_acquire);
  while (!state_.compare_exchange_weak(state, state & ~kQueued, std::memory_order_acq_rel)) {
  }
  return (state & ~kQueued) == 0;
}

}  // namespace tensord::internal
