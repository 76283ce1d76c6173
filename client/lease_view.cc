#include "client/lease_view.h"

#include <algorithm>
#include <string>

#include "client/release_queue.h"
#include "common/status.h"
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

ViewKind ConsumerViewKind(const TakeOptions& options) {
  if (options.pinned) return ViewKind::kPinned;
  return options.readonly ? ViewKind::kReadOnly : ViewKind::kPrivate;
}

LeaseView::LeaseView(Params params, std::shared_ptr<ReleaseQueue> queue)
    : cache_{std::move(params.cache_name)},
      info_(std::move(params.info)),
      lease_id_(params.lease_id),
      session_id_(params.session_id),
      kind_(params.kind),
      mapping_(std::move(params.mapping)),
      arena_slot_offset_(params.arena_slot_offset),
      arena_slot_length_(params.arena_slot_length),
      described_here_(params.described_here),
      ready_fence_(std::move(params.ready_fence)),
      ready_fence_source_(std::move(params.ready_fence_source)),
      stream_order_(mapping_ != nullptr ? mapping_->stream_order() : nullptr),
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
  if (stream_order_ != nullptr) RecordDoneFences();
  // Unreferenced and not queued: queue it, unless a lookup revived it in between.
  uint64_t expected = 0;
  if (state_.compare_exchange_strong(expected, kQueued, std::memory_order_acq_rel)) {
    ReleaseQueue::Push(this);
  }
}

absl::Status LeaseView::UseOnStream(uintptr_t stream) {
  if (stream_order_ == nullptr) return absl::OkStatus();
  const std::string what = "tensor " + std::to_string(info_.tensor_id);
  if (!ready_fence_.empty()) {
    TENSORD_RETURN_IF_ERROR(stream_order_->WaitReady(common::ReadyFence{ready_fence_, ready_fence_source_},
                                                     mapping_->device_ordinal(), stream, what));
  }
  absl::MutexLock lock(&streams_mu_);
  if (std::find(use_streams_.begin(), use_streams_.end(), stream) == use_streams_.end()) {
    use_streams_.push_back(stream);
  }
  return absl::OkStatus();
}

absl::Status LeaseView::WaitReadyOnHost() {
  if (stream_order_ == nullptr || ready_fence_.empty()) return absl::OkStatus();
  return stream_order_->WaitReadyOnHost(common::ReadyFence{ready_fence_, ready_fence_source_},
                                        mapping_->device_ordinal(), "tensor " + std::to_string(info_.tensor_id));
}

absl::StatusOr<std::string> LeaseView::RecordReady(uintptr_t stream) const {
  if (stream_order_ == nullptr) return std::string();
  return stream_order_->RecordReady(mapping_->device_ordinal(), stream,
                                    "publish tensor " + std::to_string(info_.tensor_id));
}

absl::Status LeaseView::CopyFromDevice(const void* src, uint64_t bytes, uintptr_t stream) const {
  const std::string what = "copy into tensor " + std::to_string(info_.tensor_id);
  if (stream_order_ == nullptr) {
    return absl::FailedPreconditionError(what + ": it is host memory; copy into mutable_data() instead");
  }
  if (kind_ != ViewKind::kProducer) {
    return absl::FailedPreconditionError(what + ": only its producer writes it (this is a consumer's view)");
  }
  if (src == nullptr) return absl::InvalidArgumentError(what + ": a null source pointer");
  const uint64_t room = mapping_->size() - static_cast<uint64_t>(data_ - mapping_->data());
  if (bytes > room || bytes > info_.nbytes) {
    return absl::InvalidArgumentError(what + ": " + std::to_string(bytes) + " bytes do not fit its " +
                                      std::to_string(info_.nbytes));
  }
  if (bytes == 0) return absl::OkStatus();
  return stream_order_->CopyOnStream(data_, src, bytes, mapping_->device_ordinal(), stream, what);
}

void LeaseView::RecordDoneFences() noexcept {
  absl::MutexLock lock(&streams_mu_);
  // Completed fences of an earlier round (a cached lease used again) are of no more use.
  std::erase_if(done_fences_, [](const std::unique_ptr<common::DoneFence>& fence) { return fence->Complete(); });
  for (uintptr_t stream : use_streams_) {
    absl::StatusOr<std::unique_ptr<common::DoneFence>> fence =
        stream_order_->RecordDone(mapping_->device_ordinal(), stream, "release tensor " + std::to_string(info_.tensor_id));
    if (fence.ok()) {
      done_fences_.push_back(*std::move(fence));
    } else {
      // Nothing to wait on: the release goes out as soon as the sender has it.
      spdlog::error("tensord: {}", fence.status().ToString());
    }
  }
  use_streams_.clear();
}

bool LeaseView::DoneFencesComplete() {
  if (stream_order_ == nullptr) return true;
  absl::MutexLock lock(&streams_mu_);
  std::erase_if(done_fences_, [](const std::unique_ptr<common::DoneFence>& fence) { return fence->Complete(); });
  return done_fences_.empty();
}

void LeaseView::WaitDoneFences() {
  if (stream_order_ == nullptr) return;
  absl::MutexLock lock(&streams_mu_);
  for (const std::unique_ptr<common::DoneFence>& fence : done_fences_) fence->Wait();
  done_fences_.clear();
}

bool LeaseView::SettleQueued() noexcept {
  uint64_t state = state_.load(std::memory_order_acquire);
  while (!state_.compare_exchange_weak(state, state & ~kQueued, std::memory_order_acq_rel)) {
  }
  return (state & ~kQueued) == 0;
}

}  // namespace tensord::internal
