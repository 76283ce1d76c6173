// The Broker's producer side after allocation: exports of producer-owned memory, publish
// (bind a name, describe the region, tag, TTL), and TTL expiry.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/names.h"
#include "common/status.h"
#include "common/tensor_desc.h"
#include "server/broker/broker.h"
#include "server/state/tensor_tags.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

using Tags = std::map<std::string, std::string>;

// The region an exported tensor claims in the memory adopted for it (`size` bytes).
absl::Status CheckExportFits(const common::TensorLayout& layout, uint64_t offset, uint64_t size,
                             const std::string& what) {
  v1::BufferRef ref;
  ref.set_size(size);
  ref.set_offset(offset);
  TENSORD_RETURN_IF_ERROR(common::ValidateFitsBuffer(layout, ref, "exported tensor"));
  if (size == 0) return absl::InvalidArgumentError(absl::StrCat("export: the ", what, " is empty"));
  return absl::OkStatus();
}

// What Publish checks before the lock: the name, the fence, and a new description (its layout).
absl::StatusOr<std::optional<common::TensorLayout>> ValidatePublish(const v1::PublishRequest& request) {
  if (!request.name().empty()) TENSORD_RETURN_IF_ERROR(common::ValidateName(request.name()));
  if (request.ready_fence().size() > common::kMaxReadyFenceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ready_fence: ", request.ready_fence().size(),
                                                   " bytes, more than ", common::kMaxReadyFenceBytes));
  }
  if (!request.has_desc()) return std::nullopt;
  TENSORD_ASSIGN_OR_RETURN(common::TensorLayout layout, common::ValidateDesc(request.desc()));
  return layout;
}

// Tags given at publish join those given at allocation; a key given again is replaced.
// Merged in a copy (nullopt when none are given), so that a refused publish changes nothing.
absl::StatusOr<std::optional<Tags>> MergedTags(const Tags& tags, const v1::PublishRequest& request) {
  if (request.tags().empty()) return std::nullopt;
  Tags merged = tags;
  for (const auto& [key, value] : request.tags()) merged.insert_or_assign(key, value);
  TENSORD_RETURN_IF_ERROR(ValidateTags(merged));
  return merged;
}

}  // namespace

absl::StatusOr<v1::AllocateResponse> Broker::Export(uint64_t session_id, const v1::ExportRequest& request) {
  TENSORD_ASSIGN_OR_RETURN(Tensor tensor, DescribeNewTensor(request.ns(), request.desc(), request.tags()));
  TENSORD_ASSIGN_OR_RETURN(common::MemoryHandle handle, ExportedHandle(session_id, request));
  const ResolvedDevice& device = *tensor.device;
  const std::string what = absl::StrCat("exported ", std::string(device.backend->name()), " memory");
  // Adopting checks what the producer sent (host: seals the memfd); it may block.
  TENSORD_ASSIGN_OR_RETURN(std::unique_ptr<common::BackendBuffer> memory,
                           device.backend->Adopt(device.device, std::move(handle), request.size(), what));
  const uint64_t size = memory->size();
  TENSORD_RETURN_IF_ERROR(CheckExportFits(tensor.layout, request.offset(), size, what));
  tensor.offset = request.offset();
  Effects effects;  // pooled buffers taken back for this export
  absl::Cleanup deliver = [&] { Deliver(effects); };  // after the mutex, on every return
  absl::MutexLock lock(&mu_);
  TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
  TENSORD_RETURN_IF_ERROR(ReserveExportLocked(*session, tensor, size, what, effects));
  const bool producer_owned = memory->OwnedByProducer();
  v1::AllocateResponse response = RegisterLocked(*session, std::move(tensor), std::move(memory), size);
  // The memory goes with this session's process: its tensors retire when it closes.
  if (producer_owned) session->producer_owned_buffers.insert(response.tensor().buffer().buffer_id());
  return response;
}

absl::StatusOr<common::MemoryHandle> Broker::ExportedHandle(uint64_t session_id, const v1::ExportRequest& request) {
  common::MemoryHandle handle;
  handle.data = request.handle_data();
  if (request.staged_fd_id() == 0 && !handle.data.empty()) return handle;
  absl::MutexLock lock(&mu_);
  TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
  TENSORD_RETURN_IF_ERROR(CheckLeaseCapLocked(*session));
  auto staged = session->staged_fds.find(request.staged_fd_id());
  if (staged == session->staged_fds.end()) {
    return absl::NotFoundError(absl::StrCat("export: staged fd ", request.staged_fd_id(),
                                            " is not staged by this session"));
  }
  handle.fds.push_back(std::move(staged->second));
  session->staged_fds.erase(staged);
  return handle;
}

absl::Status Broker::ReserveExportLocked(Session& session, Tensor& tensor, uint64_t size, std::string_view what,
                                         Effects& effects) {
  if (!tensor.ns.empty()) TENSORD_RETURN_IF_ERROR(access_.CheckAccess(session.creds, tensor.ns, true));
  TENSORD_RETURN_IF_ERROR(CheckLeaseCapLocked(session));
  tensor.created_unix_ms = NowUnixMs();
  tensor.producer_session = session.id;
  tensor.producer_uid = session.creds.uid;
  // The buffer's size is what the backend adopted (a memfd's own size: clients refuse an
  // fd smaller than the size the broker states), and the quota counts the same bytes.
  const uint64_t uid_host_bytes = tensor.device == &backends_->host() ? access_.UidHostBytes(tensor.ns, size) : 0;
  TENSORD_RETURN_IF_ERROR(ChargeTensorLocked(tensor, uid_host_bytes, what));
  if (absl::Status reserved = ReserveLocked(*tensor.device, size, what, effects); !reserved.ok()) {
    UnchargeTensorLocked(tensor);
    return reserved;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PublishResponse> Broker::Publish(uint64_t session_id, const v1::PublishRequest& request) {
  TENSORD_ASSIGN_OR_RETURN(std::optional<common::TensorLayout> new_layout, ValidatePublish(request));
  const std::string& name = request.name();
  Effects effects;
  v1::PublishResponse response;
  {
    absl::MutexLock lock(&mu_);
    TENSORD_ASSIGN_OR_RETURN(Session * session, SessionLocked(session_id));
    TENSORD_RETURN_IF_ERROR(CheckNamesMayChangeLocked());
    TENSORD_ASSIGN_OR_RETURN(Tensor * tensor, PublishableLocked(session_id, request.tensor_id()));
    if (new_layout) TENSORD_RETURN_IF_ERROR(CheckFitsRegionLocked(*tensor, request.desc(), *new_layout));
    std::string_view ns = name.empty() ? std::string_view(tensor->ns) : common::NamespaceOf(name);
    TENSORD_RETURN_IF_ERROR(CheckQueuedName(*tensor, name));
    if (!name.empty()) TENSORD_RETURN_IF_ERROR(CheckPublishedNameLocked(*session, *tensor, request, ns));
    TENSORD_RETURN_IF_ERROR(SealForReadersLocked(*tensor));
    TENSORD_ASSIGN_OR_RETURN(std::optional<Tags> merged_tags, MergedTags(tensor->tags, request));
    // The name, the tags (and a new description) stay in the daemon.
    TENSORD_RETURN_IF_ERROR(RechargeMetadataLocked(*tensor, new_layout ? request.desc() : tensor->desc, ns, name,
                                                   merged_tags ? *merged_tags : tensor->tags));
    CommitPublishLocked(*session, *tensor, request, ns, std::move(new_layout), std::move(merged_tags), effects);
    // The reply describes the tensor as published; a waiting take may unbind it at once.
    *response.mutable_tensor() = registry_.Describe(*tensor);
    WakeWaitersLocked(*tensor, effects);
  }
  Deliver(effects);
  return response;
}

absl::StatusOr<Tensor*> Broker::PublishableLocked(uint64_t session_id, uint64_t tensor_id) {
  Tensor* tensor = registry_.Find(tensor_id);
  if (tensor == nullptr || tensor->producer_session != session_id || !tensor->holders.contains(session_id)) {
    return absl::NotFoundError(absl::StrCat("tensor ", tensor_id, " is not being created by this session"));
  }
  if (tensor->state != v1::TENSOR_STATE_CREATING) {
    return absl::FailedPreconditionError(absl::StrCat("tensor ", tensor->id, " is already published"));
  }
  return tensor;
}

absl::Status Broker::CheckPublishedNameLocked(const Session& session, const Tensor& tensor,
                                              const v1::PublishRequest& request, std::string_view ns) {
  const std::string& name = request.name();
  if (!tensor.ns.empty() && tensor.ns != ns) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor ", tensor.id, " was allocated in namespace ", common::QuoteForError(tensor.ns),
        " and cannot be published as ", common::QuoteForError(name)));
  }
  TENSORD_RETURN_IF_ERROR(access_.CheckAccess(session.creds, ns, true));
  Tensor* current = registry_.FindByName(name);
  if (request.has_if_absent() && request.if_absent() && current != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat(common::QuoteForError(name), " is already bound (generation ",
                                                 current->generation, ")"));
  }
  const uint64_t have = current == nullptr ? 0 : current->generation;
  if (request.has_if_generation() && have != request.if_generation()) {
    return absl::AbortedError(absl::StrCat(common::QuoteForError(name), " is at generation ", have, ", not ",
                                           request.if_generation()));
  }
  return absl::OkStatus();
}

absl::Status Broker::SealForReadersLocked(const Tensor& tensor) {
  if (tensor.buffer_id == 0) return absl::OkStatus();
  // The seal is what protects readers: check it before any reader can get the fd.
  Buffer* buffer = registry_.FindBuffer(tensor.buffer_id);
  TENSORD_CHECK(buffer != nullptr);
  if (buffer->reader_sealed) return absl::OkStatus();
  TENSORD_RETURN_IF_ERROR(buffer->memory->CheckShareable(absl::StrCat("buffer of tensor ", tensor.id)));
  buffer->reader_sealed = true;
  return absl::OkStatus();
}

void Broker::CommitPublishLocked(Session& session, Tensor& tensor, const v1::PublishRequest& request,
                                 std::string_view ns, std::optional<common::TensorLayout> new_layout,
                                 std::optional<std::map<std::string, std::string>> merged_tags, Effects& effects) {
  if (new_layout) {
    // Every check passed: from here on (reply, Stat, acquires) the new description holds.
    tensor.desc = request.desc();
    tensor.desc.clear_strides();
    *tensor.desc.mutable_device() = tensor.device->device.device;
  }
  registry_.SetNamespaceAndLayout(tensor, std::string(ns), new_layout ? *std::move(new_layout) : tensor.layout);
  tensor.state = v1::TENSOR_STATE_SEALED;
  ++session.publishes;
  if (merged_tags) tensor.tags = *std::move(merged_tags);
  if (!request.ready_fence().empty()) {
    tensor.ready_fence = request.ready_fence();
    session.ready_fenced_tensors.insert(tensor.id);
  }
  if (request.name().empty()) {
    tensor.generation = registry_.NextGeneration();
    return;
  }
  BindLocked(tensor, request.name(), effects);
  tensor.evictable = request.evictable();
  if (request.ttl_ms() > 0) ScheduleTtlLocked(tensor, request.ttl_ms());
  if (request.unbind_on_exit()) {
    tensor.unbind_on_exit = true;
    session.unbound_on_exit.insert(tensor.id);
  }
}

absl::Status Broker::CheckFitsRegionLocked(const Tensor& tensor, const v1::TensorDesc& desc,
                                           const common::TensorLayout& layout) {
  // Devices compare as the broker resolves them: the caller's ordinal may differ from ours.
  absl::StatusOr<const ResolvedDevice*> device = backends_->Resolve(desc.device());
  if (!device.ok() || *device != tensor.device) {
    const v1::Device& had = tensor.desc.device();
    return absl::InvalidArgumentError(absl::StrCat(
        "desc.device: tensor ", tensor.id, " was allocated on ", v1::DeviceType_Name(had.type()),
        " device ", had.index(), ", not ", v1::DeviceType_Name(desc.device().type()), " device ",
        desc.device().index()));
  }
  // The region is what the tensor was given: its arena slot, or the rest of its own buffer.
  uint64_t region = 0;
  const char* what = "its buffer";
  if (tensor.buffer_id != 0) {
    const Buffer* buffer = registry_.FindBuffer(tensor.buffer_id);
    TENSORD_CHECK(buffer != nullptr && buffer->size >= tensor.offset);
    region = tensor.slot_bytes > 0 ? tensor.slot_bytes : buffer->size - tensor.offset;
    if (tensor.slot_bytes > 0) what = "its arena slot";
  }
  if (layout.extent > region) {
    return absl::InvalidArgumentError(absl::StrCat(
        "desc: extent of ", layout.extent, " bytes does not fit the ", region,
        "-byte region tensor ", tensor.id, " was allocated (", what, ")"));
  }
  // Clients refuse a tensor of no elements that has a buffer.
  if (layout.extent == 0 && tensor.buffer_id != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "desc.shape has no elements, but tensor ", tensor.id, " has a buffer"));
  }
  return absl::OkStatus();
}

void Broker::ScheduleTtlLocked(Tensor& tensor, uint64_t ttl_ms) {
  ttl_ms = std::min(ttl_ms, common::kMaxDurationMs);
  uint64_t id = tensor.id;
  uint64_t generation = tensor.generation;
  tensor.ttl_deadline_unix_ms = NowUnixMs() + static_cast<int64_t>(ttl_ms);
  tensor.ttl_timer = timers_.Schedule(
      TimerQueue::Clock::now() + std::chrono::milliseconds(ttl_ms),
      [this, id, generation] { ExpireTtl(id, generation); });
}

void Broker::ExpireTtl(uint64_t tensor_id, uint64_t generation) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    Tensor* tensor = registry_.Find(tensor_id);
    if (tensor == nullptr || tensor->name.empty() || tensor->generation != generation) return;
    tensor->ttl_timer = 0;
    spdlog::debug("binding {} expired (TTL)", tensor->name);
    UnbindLocked(*tensor, effects);
  }
  Deliver(effects);
}

}  // namespace tensord::server
