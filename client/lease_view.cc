#include "client/lease_view.h"

#include "client/release_queue.h"
#include "common/check.h"

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
  }
  return common::MapMode::kPrivate;
}

LeaseView::LeaseView(Params params, std::shared_ptr<ReleaseQueue> queue)
    : cache_name(std::move(params.cache_name)),
      info_(std::move(params.info)),
      lease_id_(params.lease_id),
      session_id_(params.session_id),
      kind_(params.kind),
      mapping_(std::move(params.mapping)),
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

bool LeaseView::TryRef() noexcept {
  int64_t n = refs_.load(std::memory_order_relaxed);
  while (n > 0) {
    if (refs_.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel,
                                    std::memory_order_relaxed)) {
      return true;
    }
  }
  return false;
}

void LeaseView::Unref() noexcept {
  int64_t before = refs_.fetch_sub(1, std::memory_order_acq_rel);
  TENSORD_CHECK(before > 0);
  if (before == 1) ReleaseQueue::Push(this);
}

}  // namespace tensord::internal
