#include "client/lease_adopter.h"

#include <errno.h>
#include <fcntl.h>

#include <algorithm>
#include <span>
#include <utility>

#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "common/status.h"
#include "common/tensor_desc.h"

namespace tensord::internal {

LeaseAdopter::LeaseAdopter(FdConnection& fd, MappingCache& mappings, LeaseCache& leases,
                           std::shared_ptr<ReleaseQueue> queue)
    : fd_(fd),
      instance_nonce_(fd.welcome().instance_nonce()),
      session_id_(fd.welcome().session_id()),
      mappings_(mappings),
      leases_(leases),
      queue_(std::move(queue)) {}

Retention LeaseAdopter::RetentionFor(const tensord::v1::TensorInfo& tensor, ViewKind kind) {
  // A recycled buffer carries its producer's next tensors: a reader keeps its mapping for
  // them (the producer's is kept by its Session's RecycledBuffers).
  if (tensor.buffer().recyclable() && kind != ViewKind::kProducer) return Retention::kLinger;
  if (!tensor.buffer().arena()) return Retention::kNone;
  // The producer has sealed the arena F_SEAL_FUTURE_WRITE: it could not map it writable
  // again, and its later tensors land in the same arena.
  return kind == ViewKind::kProducer ? Retention::kSession : Retention::kLinger;
}

MappingKey LeaseAdopter::KeyFor(uint64_t buffer_id, ViewKind kind) const {
  return MappingKey{instance_nonce_, buffer_id, MapModeOf(kind), ViewTypeOf(kind)};
}

absl::StatusOr<std::shared_ptr<Mapping>> LeaseAdopter::MapBuffer(const tensord::v1::TensorInfo& tensor,
                                                                 ViewKind kind, int export_fd) {
  const uint64_t buffer_id = tensor.buffer().buffer_id();
  const MappingKey key = KeyFor(buffer_id, kind);
  const Retention retention = RetentionFor(tensor, kind);
  if (export_fd >= 0) {
    // The producer maps the memfd it exported itself: no fetch.
    common::FetchedBuffer exported;
    exported.buffer_id = buffer_id;
    exported.size = tensor.buffer().size();
    exported.device_type = tensor.desc().device().type();
    const int fd = ::fcntl(export_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return common::ErrnoToStatus("dup the exported memfd", errno);
    exported.handle.fds.emplace_back(fd);
    return mappings_.GetOrMapHandle(key, exported, retention);
  }
  // A producer's fresh dedicated buffer is about to be written whole.
  const bool populate = kind == ViewKind::kProducer && !tensor.buffer().arena();
  MappingCache::FetchFn fetch = [this, buffer_id, populate]() -> absl::StatusOr<common::FetchedBuffer> {
    const uint64_t ids[1] = {buffer_id};
    TENSORD_ASSIGN_OR_RETURN(std::vector<common::FetchedBuffer> fetched, fd_.Fetch(ids));
    fetched[0].populate = populate;
    return std::move(fetched[0]);
  };
  return mappings_.GetOrMap(key, fetch, retention);
}

absl::StatusOr<LeaseView*> LeaseAdopter::AdoptLease(uint64_t lease_id,
                                                    const tensord::v1::TensorInfo& tensor,
                                                    GrantedFence ready_fence, ViewKind kind, std::string_view cache_name,
                                                    std::string_view what, const OwnMemory& own,
                                                    bool described_here) {
  auto give_back = [&](absl::Status status) -> absl::Status {
    queue_->PushLeaseIds({lease_id});
    return status;
  };
  if (lease_id == 0) return absl::InternalError(std::string(what) + ": the broker sent no lease");
  absl::StatusOr<ValidatedTensor> valid = ValidateTensorInfo(tensor, what);
  if (!valid.ok()) return give_back(valid.status());
  if (kind != ViewKind::kProducer) {
    if (LeaseView* held = leases_.FindByTensor(valid->info.tensor_id, kind, cache_name)) {
      queue_->PushLeaseIds({lease_id});  // one remote lease per tensor is enough
      return held;
    }
  }
  absl::StatusOr<std::shared_ptr<Mapping>> mapping = MapTensor(tensor, *valid, kind, own, what);
  if (!mapping.ok()) return give_back(mapping.status());
  const uint64_t offset = valid->layout.nbytes > 0 ? valid->buffer_offset + valid->info.byte_offset : 0;
  LeaseView::Params params;
  params.info = std::move(valid->info);
  // The description carries the daemon's ordinal; DLPack wants this process's.
  if (*mapping != nullptr) NameDeviceHere(**mapping, params.info);
  params.lease_id = lease_id;
  params.session_id = session_id_;
  params.kind = kind;
  params.mapping = *std::move(mapping);
  params.offset_in_mapping = offset;
  params.cache_name = std::string(cache_name);
  params.described_here = described_here;
  SetReadyFence(ready_fence, params);
  // A mapping that outlives the lease (an arena's, a recycled buffer's) must not show the
  // next tensor there our private copies of its pages.
  if (kind == ViewKind::kPrivate && (tensor.buffer().arena() || tensor.buffer().recyclable()) &&
      params.mapping != nullptr) {
    params.arena_slot_offset = valid->buffer_offset;
    params.arena_slot_length = valid->layout.extent;
  }
  return IndexView(std::move(params), lease_id);
}

absl::StatusOr<std::shared_ptr<Mapping>> LeaseAdopter::MapTensor(const tensord::v1::TensorInfo& tensor,
                                                                 const ValidatedTensor& valid, ViewKind kind,
                                                                 const OwnMemory& own, std::string_view what) {
  if (valid.layout.nbytes == 0) return nullptr;
  absl::StatusOr<std::shared_ptr<Mapping>> mapped =
      own.mapping != nullptr ? own.mapping : MapBuffer(tensor, kind, own.memfd);
  if (!mapped.ok()) return Annotate(mapped.status(), what);
  const uint64_t size = (*mapped)->size();
  if (valid.buffer_offset > size || valid.layout.extent > size - valid.buffer_offset) {
    return absl::DataLossError(std::string(what) + ": the tensor reaches past its " + std::to_string(size) +
                               "-byte buffer");
  }
  return mapped;
}

void LeaseAdopter::NameDeviceHere(const Mapping& mapping, TensorInfo& info) {
  info.device.device_id = mapping.device_ordinal();
  if (mapping.view_device_type() != tensord::v1::DEVICE_TYPE_UNSPECIFIED) {
    tensord::v1::Device view;
    view.set_type(mapping.view_device_type());
    view.set_index(mapping.device_ordinal());
    info.device = ToDLDevice(view);
  }
}

void LeaseAdopter::SetReadyFence(GrantedFence ready_fence, LeaseView::Params& params) const {
  params.ready_fence = std::string(ready_fence.bytes);
  if (ready_fence.producer_session != 0) {
    params.ready_fence_source = instance_nonce_;
    params.ready_fence_source.append(reinterpret_cast<const char*>(&ready_fence.producer_session),
                                     sizeof(ready_fence.producer_session));
  }
}

LeaseView* LeaseAdopter::IndexView(LeaseView::Params&& params, uint64_t lease_id) {
  auto* view = new LeaseView(std::move(params), queue_);
  LeaseCache::InsertResult inserted = leases_.Insert(view);
  for (LeaseView* old : inserted.to_release) ReleaseQueue::Push(old);
  if (!inserted.inserted) {
    // Another acquire of the same tensor won the race; keep its lease, give back ours.
    queue_->PushLeaseIds({lease_id});
    delete view;
  }
  return inserted.view;
}

absl::Status LeaseAdopter::OrderOnStream(std::span<LeaseView* const> views, uintptr_t stream) {
  for (LeaseView* view : views) {
    if (!view->stream_ordered()) continue;
    if (absl::Status ordered = view->UseOnStream(stream); !ordered.ok()) {
      for (LeaseView* each : views) each->Unref();
      return ordered;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LeaseView*> LeaseAdopter::Ordered(absl::StatusOr<LeaseView*> view, uintptr_t stream) {
  if (view.ok()) {
    LeaseView* const one = *view;
    TENSORD_RETURN_IF_ERROR(OrderOnStream({&one, 1}, stream));
  }
  return view;
}

absl::StatusOr<std::vector<LeaseView*>> LeaseAdopter::Ordered(absl::StatusOr<std::vector<LeaseView*>> views,
                                                              uintptr_t stream) {
  if (views.ok()) TENSORD_RETURN_IF_ERROR(OrderOnStream(*views, stream));
  return views;
}

void LeaseAdopter::AbandonBatch(const std::vector<LeaseView*>& views,
                                const std::vector<uint64_t>& lease_ids) {
  queue_->PushLeaseIds(lease_ids);
  for (LeaseView* view : views) {
    if (view != nullptr) view->Unref();
  }
}

std::vector<std::shared_ptr<Mapping>> LeaseAdopter::PrefetchBuffers(
    const std::vector<const tensord::v1::TensorInfo*>& tensors, ViewKind kind) {
  std::vector<BufferToMap> buffers;
  buffers.reserve(tensors.size());
  for (const tensord::v1::TensorInfo* tensor : tensors) {
    if (tensor->buffer().buffer_id() == 0) continue;  // a zero-byte tensor has no buffer
    buffers.push_back(BufferToMap{KeyFor(tensor->buffer().buffer_id(), kind),
                                  RetentionFor(*tensor, kind)});
  }
  if (buffers.empty()) return {};
  MappingCache::FetchManyFn fetch = [this](std::span<const uint64_t> ids) { return fd_.Fetch(ids); };
  absl::StatusOr<std::vector<std::shared_ptr<Mapping>>> mapped = mappings_.GetOrMapMany(buffers, fetch);
  // On failure each element maps its own buffer in AdoptLease, which names what failed.
  if (!mapped.ok()) return {};
  return *std::move(mapped);
}

absl::Status LeaseAdopter::AdoptBatch(const std::vector<Grant>& grants, ViewKind kind,
                                      const std::vector<std::string>* cache_names,
                                      const std::function<std::string(size_t)>& what,
                                      std::vector<LeaseView*>& views) {
  std::vector<const tensord::v1::TensorInfo*> tensors;
  tensors.reserve(grants.size());
  for (const Grant& grant : grants) tensors.push_back(grant.tensor);
  // Held until every view holds its own reference.
  const std::vector<std::shared_ptr<Mapping>> prefetched = PrefetchBuffers(tensors, kind);
  for (size_t k = 0; k < grants.size(); ++k) {
    const Grant& grant = grants[k];
    const std::string_view cache_name =
        cache_names != nullptr ? std::string_view((*cache_names)[grant.index]) : std::string_view();
    absl::StatusOr<LeaseView*> view =
        AdoptLease(grant.lease_id, *grant.tensor, grant.ready_fence, kind, cache_name, what(grant.index));
    if (!view.ok()) {
      // AdoptLease gave back this grant's lease; the rest of the batch goes too.
      std::vector<uint64_t> left;
      for (size_t j = k + 1; j < grants.size(); ++j) left.push_back(grants[j].lease_id);
      AbandonBatch(views, left);
      std::fill(views.begin(), views.end(), nullptr);
      return view.status();
    }
    views[grant.index] = *view;
  }
  return absl::OkStatus();
}

}  // namespace tensord::internal
