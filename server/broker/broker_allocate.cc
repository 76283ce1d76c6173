// The Broker's allocations: placement carried out, buffers made off the request threads
// (the Executor), arenas made once per session and namespace, tensors registered.
#include <algorithm>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

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

// What an allocation asks for besides its description, as Placement reads it.
Placement::Request WantsOf(const v1::AllocateRequest& request) {
  return Placement::Request{request.isolated(), request.recyclable(),
                            std::span<const uint64_t>(request.reuse_buffer_ids().data(),
                                                      request.reuse_buffer_ids_size())};
}

}  // namespace

absl::StatusOr<Tensor> Broker::DescribeNewTensor(const std::string& ns, const v1::TensorDesc& desc,
                                                 const google::protobuf::Map<std::string, std::string>& tags) const {
  TENSORD_ASSIGN_OR_RETURN(common::TensorLayout layout, common::ValidateDesc(desc));
  TENSORD_ASSIGN_OR_RETURN(const ResolvedDevice* device, backends_->Resolve(desc.device()));
  if (!ns.empty()) TENSORD_RETURN_IF_ERROR(common::ValidateNamespace(ns));
  TENSORD_RETURN_IF_ERROR(ValidateTags(tags));
  Tensor tensor;
  tensor.ns = ns;
  tensor.desc = desc;
  tensor.desc.clear_strides();
  // The description names the device as the broker knows it: its UUID and the daemon's
  // ordinal (each client turns the UUID into its own ordinal).
  *tensor.desc.mutable_device() = device->device.device;
  tensor.device = device;
  tensor.layout = layout;
  tensor.tags.insert(tags.begin(), tags.end());
  return tensor;
}

uint64_t Broker::Allocate(uint64_t session_id, const v1::AllocateRequest& request,
                          Completion<v1::AllocateResponse> done) {
  if (request.has_queue()) return AllocateInQueue(session_id, request, std::move(done));
  AllocateNow(session_id, request, std::move(done));
  return 0;
}

void Broker::AllocateNow(uint64_t session_id, const v1::AllocateRequest& request,
                         Completion<v1::AllocateResponse> done) {
  absl::StatusOr<Tensor> tensor = DescribeNewTensor(request.ns(), request.desc(), request.tags());
  if (!tensor.ok()) return std::move(done)(tensor.status());
  if (request.has_queue()) tensor->queue_prefix = request.queue().prefix();
  tensor->created_unix_ms = NowUnixMs();
  tensor->producer_session = session_id;
  tensor->recyclable_requested = request.recyclable();
  const ResolvedDevice& device = *tensor->device;
  const uint64_t extent = tensor->layout.extent;
  const uint64_t size = extent == 0 ? 0 : device.backend->RoundUp(device.device, extent);
  Effects effects;  // pooled buffers taken back for this allocation
  absl::Cleanup deliver = [&] { Deliver(effects); };  // after the mutex and the answer, on every return
  absl::StatusOr<Placement::Choice> choice;
  std::optional<absl::StatusOr<v1::AllocateResponse>> answer;  // set: answered without making memory
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> session = SessionLocked(session_id);
    choice = session.ok() ? PlaceAllocationLocked(**session, *tensor, WantsOf(request), size, effects)
                          : absl::StatusOr<Placement::Choice>(session.status());
    if (!choice.ok()) {
      answer = choice.status();
    } else if (choice->kind == Placement::Kind::kArenaSlot) {
      answer = RegisterLocked(**session, *std::move(tensor), nullptr, 0);
    } else if (choice->kind == Placement::Kind::kRecycled) {
      answer = RegisterRecycledLocked(**session, *std::move(tensor), *std::move(choice->recycled));
    } else if (choice->kind == Placement::Kind::kAwaitArena) {
      const std::string ns = tensor->ns;
      return arenas_.Enqueue(session_id, ns, QueuedAllocate{*std::move(tensor), std::move(done)});
    }
  }
  if (answer) return std::move(done)(*std::move(answer));
  if (choice->kind == Placement::Kind::kNoMemory) {
    return FinishAllocate(session_id, 0, false, *std::move(tensor), std::unique_ptr<common::BackendBuffer>(),
                          std::move(done));
  }
  PostAllocation(session_id, choice->bytes, choice->kind == Placement::Kind::kNewArena, *std::move(tensor),
                 std::move(done));
}

absl::StatusOr<Placement::Choice> Broker::PlaceAllocationLocked(Session& session, Tensor& tensor,
                                                                const Placement::Request& wants, uint64_t size,
                                                                Effects& effects) {
  if (!tensor.ns.empty()) TENSORD_RETURN_IF_ERROR(access_.CheckAccess(session.creds, tensor.ns, true));
  TENSORD_RETURN_IF_ERROR(CheckLeaseCapLocked(session));
  tensor.producer_uid = session.creds.uid;
  const bool in_arena = placement_.InArena(tensor, wants);
  const std::string what = absl::StrCat("allocating a ", common::DTypeName(tensor.desc.dtype()), " tensor of ",
                                        tensor.layout.nbytes, " bytes");
  // An arena's bytes are its namespace's, not its producer's.
  const uint64_t uid_host_bytes =
      in_arena || tensor.device != &backends_->host() ? 0 : access_.UidHostBytes(tensor.ns, size);
  TENSORD_RETURN_IF_ERROR(ChargeTensorLocked(tensor, uid_host_bytes, what));
  Placement::Choice choice = in_arena ? placement_.ChooseArena(registry_, session, tensor)
                                      : placement_.ChooseBuffer(session, tensor, wants, size);
  absl::Status reserved;
  if (choice.kind == Placement::Kind::kNewArena) {
    reserved = ReserveArenaLocked(tensor.ns, choice.bytes, effects);
    if (reserved.ok()) arenas_.StartMaking(session.id, tensor.ns);
  } else if (choice.kind == Placement::Kind::kDedicated) {
    reserved = ReserveLocked(*tensor.device, choice.bytes, what, effects);
  }
  if (!reserved.ok()) {
    UnchargeTensorLocked(tensor);
    return reserved;
  }
  return choice;
}

void Broker::PostAllocation(uint64_t session_id, uint64_t size, bool arena, Tensor tensor,
                            Completion<v1::AllocateResponse> done) {
  executor_.Post([this, session_id, size, arena, tensor = std::move(tensor),
                  done = std::move(done)]() mutable {
    const ResolvedDevice& device = *tensor.device;
    absl::StatusOr<std::unique_ptr<common::BackendBuffer>> memory = device.backend->Allocate(
        device.device, size, absl::StrCat(arena ? "tensord-arena-" : "tensord-session-", session_id));
    FinishAllocate(session_id, size, arena, std::move(tensor), std::move(memory), std::move(done));
  });
}

absl::Status Broker::ReserveArenaLocked(std::string_view ns, uint64_t bytes, Effects& effects) {
  return ReserveLocked(backends_->host(), bytes,
                       absl::StrCat("allocating a new arena for namespace ", common::QuoteForError(ns)), effects);
}

void Broker::ReleaseArenasLocked(Session& session, Effects& effects) {
  for (std::unique_ptr<common::BackendBuffer>& memory : arenas_.ReleaseArenas(registry_, session)) {
    memory_quota_.Release(MemoryQuota::kHost, memory->size());
    effects.garbage.push_back(std::move(memory));
  }
}

void Broker::FinishAllocate(uint64_t session_id, uint64_t size, bool arena, Tensor tensor,
                            absl::StatusOr<std::unique_ptr<common::BackendBuffer>> memory,
                            Completion<v1::AllocateResponse> done) {
  FinishedAllocations finished;
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    // The first tensor and whatever queued behind the arena it waited for, in order.
    const std::string ns = tensor.ns;
    const ResolvedDevice& device = *tensor.device;
    std::vector<QueuedAllocate> batch;
    batch.push_back(QueuedAllocate{std::move(tensor), std::move(done)});
    if (arena) {
      for (QueuedAllocate& entry : arenas_.FinishMaking(session_id, ns)) batch.push_back(std::move(entry));
    }
    Session* session = sessions_.Find(session_id);
    if (absl::Status failed = CheckMadeMemoryLocked(session, memory.status(), device, effects); !failed.ok()) {
      memory_quota_.Release(device.key, size);
      for (QueuedAllocate& entry : batch) RefuseLocked(entry, failed, finished);
    } else if (!arena) {
      FinishBufferLocked(*session, std::move(batch[0]), *std::move(memory), size, finished, effects);
    } else {
      FillArenaLocked(*session, ns, size, *std::move(memory), std::move(batch), finished, effects);
    }
  }
  Deliver(effects);
  for (auto& [completion, result] : finished.answers) std::move(completion)(std::move(result));
  if (finished.next_arena) {
    PostAllocation(session_id, finished.next_arena_bytes, true, std::move(finished.next_arena->tensor),
                   std::move(finished.next_arena->done));
  }
}

absl::Status Broker::CheckMadeMemoryLocked(const Session* session, absl::Status made, const ResolvedDevice& device,
                                           Effects& effects) {
  if (session == nullptr) return absl::CancelledError("the session closed during Allocate");
  if (made.code() != absl::StatusCode::kResourceExhausted || pool_.size() == 0) return made;
  // The node itself is short of memory (the quota had room): every idle pooled buffer on the
  // device goes, so that a retry finds the memory once their producers unmapped.
  std::vector<BufferPool::Entry> evicted = pool_.EvictOldest(&device, std::numeric_limits<uint64_t>::max());
  if (evicted.empty()) return made;
  absl::Status failed = absl::ResourceExhaustedError(
      absl::StrCat(made.message(), " (", evicted.size(), " idle recycled buffers were given back: try again)"));
  FreeRecycledLocked(std::move(evicted), effects);
  return failed;
}

void Broker::RefuseLocked(QueuedAllocate& allocation, const absl::Status& why, FinishedAllocations& finished) {
  UnchargeTensorLocked(allocation.tensor);
  finished.answers.emplace_back(std::move(allocation.done), why);
}

void Broker::FinishBufferLocked(Session& session, QueuedAllocate allocation,
                                std::unique_ptr<common::BackendBuffer> memory, uint64_t size,
                                FinishedAllocations& finished, Effects& effects) {
  // Other calls of the session may have taken the last lease under the cap meanwhile.
  if (absl::Status cap = CheckLeaseCapLocked(session); !cap.ok()) {
    memory_quota_.Release(allocation.tensor.device->key, size);
    RefuseLocked(allocation, cap, finished);
    if (memory != nullptr) effects.garbage.push_back(std::move(memory));
    return;
  }
  finished.answers.emplace_back(std::move(allocation.done),
                                RegisterLocked(session, std::move(allocation.tensor), std::move(memory), size));
}

void Broker::FillArenaLocked(Session& session, const std::string& ns, uint64_t size,
                             std::unique_ptr<common::BackendBuffer> memory, std::vector<QueuedAllocate> batch,
                             FinishedAllocations& finished, Effects& effects) {
  const uint64_t arena_id = arenas_.AddArena(registry_, session, ns, size, std::move(memory));
  registry_.FindBuffer(arena_id)->device = &backends_->host();
  Placement::Overflow overflow = placement_.PlaceBatch(
      registry_, session, std::move(batch),
      // Checked as each is reached: the ones placed before it hold leases by then.
      [&](QueuedAllocate& allocation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        absl::Status cap = CheckLeaseCapLocked(session);
        if (!cap.ok()) RefuseLocked(allocation, cap, finished);
        return cap.ok();
      },
      [&](QueuedAllocate& allocation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        finished.answers.emplace_back(std::move(allocation.done),
                                      RegisterLocked(session, std::move(allocation.tensor), nullptr, 0));
      });
  if (!overflow.allocations.empty()) QueueNextArenaLocked(session.id, ns, std::move(overflow), finished, effects);
}

void Broker::QueueNextArenaLocked(uint64_t session_id, const std::string& ns, Placement::Overflow overflow,
                                  FinishedAllocations& finished, Effects& effects) {
  absl::Status reserved = ReserveArenaLocked(ns, overflow.next_arena_bytes, effects);
  if (!reserved.ok()) {
    for (QueuedAllocate& allocation : overflow.allocations) RefuseLocked(allocation, reserved, finished);
    return;
  }
  // The new arena is full: the first that did not fit makes the next, the rest wait for it.
  arenas_.StartMaking(session_id, ns);
  finished.next_arena_bytes = overflow.next_arena_bytes;
  finished.next_arena = std::move(overflow.allocations[0]);
  for (size_t k = 1; k < overflow.allocations.size(); ++k) {
    arenas_.Enqueue(session_id, ns, std::move(overflow.allocations[k]));
  }
}

v1::AllocateResponse Broker::RegisterLocked(Session& session, Tensor tensor,
                                            std::unique_ptr<common::BackendBuffer> memory,
                                            uint64_t size) {
  bool recyclable = false;
  if (memory != nullptr) {
    Buffer buffer;
    buffer.id = registry_.NextBufferId();
    buffer.size = size;
    // Recycled only within one namespace (a reader who kept its fd sees later tensors),
    // for a producer that keeps its writable mapping.
    recyclable = tensor.recyclable_requested && pool_.enabled() && !tensor.ns.empty() && memory->Recyclable();
    buffer.recyclable = recyclable;
    buffer.memory = std::move(memory);
    buffer.device = tensor.device;
    tensor.buffer_id = buffer.id;
    registry_.AddBuffer(std::move(buffer));
  }
  tensor.id = registry_.NextTensorId();
  v1::AcquireResponse granted = GrantLocked(session, registry_.AddTensor(std::move(tensor)));
  v1::AllocateResponse response;
  response.set_lease_id(granted.lease_id());
  *response.mutable_tensor() = std::move(*granted.mutable_tensor());
  response.set_recyclable(recyclable);
  return response;
}

v1::AllocateResponse Broker::RegisterRecycledLocked(Session& session, Tensor tensor, BufferPool::Entry entry) {
  Buffer buffer;
  buffer.id = entry.buffer_id;
  buffer.size = entry.size;
  buffer.memory = std::move(entry.memory);
  buffer.device = entry.device;
  buffer.reader_sealed = entry.reader_sealed;  // seals stay on the memfd
  buffer.readers = std::move(entry.readers);   // and readers keep their mappings
  buffer.recyclable = true;
  tensor.buffer_id = buffer.id;
  registry_.AddBuffer(std::move(buffer));
  v1::AllocateResponse response = RegisterLocked(session, std::move(tensor), nullptr, 0);
  response.set_recyclable(true);
  return response;
}

}  // namespace tensord::server
