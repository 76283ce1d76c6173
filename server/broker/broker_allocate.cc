// The Broker's allocations: placement carried out, buffers made off the request threads
// (the Executor), arenas made once per session and namespace, tensors registered.
#include <algorithm>
#include <limits>
#include <optional>
#include <span>
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

void Broker::Allocate(uint64_t session_id, const v1::AllocateRequest& request,
                      Completion<v1::AllocateResponse> done) {
  auto fail = [&](absl::Status status) { std::move(done)(std::move(status)); };
  absl::StatusOr<common::TensorLayout> layout = common::ValidateDesc(request.desc());
  if (!layout.ok()) return fail(layout.status());
  absl::StatusOr<const ResolvedDevice*> device = backends_->Resolve(request.desc().device());
  if (!device.ok()) return fail(device.status());
  if (!request.ns().empty()) {
    if (absl::Status status = common::ValidateNamespace(request.ns()); !status.ok()) return fail(status);
  }
  if (absl::Status status = ValidateTags(request.tags()); !status.ok()) return fail(status);
  Tensor tensor;
  tensor.ns = request.ns();
  tensor.desc = request.desc();
  tensor.desc.clear_strides();
  // The description names the device as the broker knows it: its UUID and the daemon's
  // ordinal (each client turns the UUID into its own ordinal).
  *tensor.desc.mutable_device() = (*device)->device.device;
  tensor.device = *device;
  tensor.layout = *layout;
  tensor.tags.insert(request.tags().begin(), request.tags().end());
  tensor.created_unix_ms = NowUnixMs();
  tensor.producer_session = session_id;
  tensor.recyclable_requested = request.recyclable();
  uint64_t size = layout->extent == 0 ? 0 : (*device)->backend->RoundUp((*device)->device, layout->extent);
  const Placement::Request wants{request.isolated(), request.recyclable(),
                                 std::span<const uint64_t>(request.reuse_buffer_ids().data(),
                                                           request.reuse_buffer_ids_size())};
  bool in_arena = false;
  std::optional<absl::StatusOr<v1::AllocateResponse>> placed;
  Effects effects;  // pooled buffers taken back for this allocation
  absl::Cleanup deliver = [&] { Deliver(effects); };  // after the mutex, on every return
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Session*> session = SessionLocked(session_id);
    if (!session.ok()) return fail(session.status());
    if (!tensor.ns.empty()) {
      absl::Status status = access_.CheckAccess((*session)->creds, tensor.ns, true);
      if (!status.ok()) return fail(status);
    }
    if (absl::Status cap = CheckLeaseCapLocked(**session); !cap.ok()) return fail(cap);
    tensor.producer_uid = (*session)->creds.uid;
    in_arena = placement_.InArena(tensor, wants);
    const std::string what = absl::StrCat("allocating a ", common::DTypeName(tensor.desc.dtype()),
                                          " tensor of ", layout->nbytes, " bytes");
    const uint64_t uid_host_bytes = in_arena || *device != &backends_->host() ? 0 : access_.UidHostBytes(tensor.ns, size);
    if (absl::Status charged = ChargeTensorLocked(tensor, uid_host_bytes, what);
        !charged.ok()) {
      return fail(charged);
    }
    Placement::Choice choice = placement_.Choose(registry_, **session, tensor, wants, size);
    absl::Status reserved;
    switch (choice.kind) {
      case Placement::Kind::kNoMemory:
        break;
      case Placement::Kind::kArenaSlot:
        placed = RegisterLocked(**session, std::move(tensor), nullptr, 0);
        break;
      case Placement::Kind::kAwaitArena: {
        std::string ns = tensor.ns;
        arenas_.Enqueue(session_id, ns, QueuedAllocate{std::move(tensor), std::move(done)});
        return;
      }
      case Placement::Kind::kNewArena:
        size = choice.bytes;
        reserved = ReserveArenaLocked(tensor.ns, size, effects);
        if (reserved.ok()) arenas_.StartMaking(session_id, tensor.ns);
        break;
      case Placement::Kind::kRecycled:
        placed = RegisterRecycledLocked(**session, std::move(tensor), *std::move(choice.recycled));
        break;
      case Placement::Kind::kDedicated:
        reserved = ReserveLocked(**device, size, what, effects);
        break;
    }
    if (!reserved.ok()) {
      UnchargeTensorLocked(tensor);
      return fail(reserved);
    }
  }
  if (placed) return std::move(done)(std::move(*placed));
  if (size == 0) {
    return FinishAllocate(session_id, 0, false, std::move(tensor),
                          std::unique_ptr<common::BackendBuffer>(), std::move(done));
  }
  PostAllocation(session_id, size, in_arena, std::move(tensor), std::move(done));
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
  std::vector<std::pair<Completion<v1::AllocateResponse>, absl::StatusOr<v1::AllocateResponse>>> results;
  std::optional<QueuedAllocate> next_arena;  // overflow that needs yet another arena
  uint64_t next_arena_bytes = 0;
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    // The first tensor and whatever queued behind the arena it waited for, in order.
    std::vector<QueuedAllocate> batch;
    std::string ns = tensor.ns;
    batch.push_back(QueuedAllocate{std::move(tensor), std::move(done)});
    if (arena) {
      for (QueuedAllocate& entry : arenas_.FinishMaking(session_id, ns)) batch.push_back(std::move(entry));
    }
    Session* session = sessions_.Find(session_id);
    absl::Status failed = session == nullptr ? absl::CancelledError("the session closed during Allocate")
                                             : memory.status();
    const std::string& device_key = batch[0].tensor.device->key;
    if (failed.code() == absl::StatusCode::kResourceExhausted && pool_.size() > 0) {
      // The node itself is short of memory (the quota had room): every idle pooled buffer
      // on the device goes, so that a retry finds the memory once their producers unmapped.
      std::vector<BufferPool::Entry> evicted =
          pool_.EvictOldest(batch[0].tensor.device, std::numeric_limits<uint64_t>::max());
      if (!evicted.empty()) {
        failed = absl::ResourceExhaustedError(absl::StrCat(
            failed.message(), " (", evicted.size(), " idle recycled buffers were given back: try again)"));
        FreeRecycledLocked(std::move(evicted), effects);
      }
    }
    if (!failed.ok()) {
      memory_quota_.Release(device_key, size);
      for (QueuedAllocate& entry : batch) {
        UnchargeTensorLocked(entry.tensor);
        results.emplace_back(std::move(entry.done), failed);
      }
    } else if (!arena) {
      // Other calls of the session may have taken the last lease under the cap meanwhile.
      absl::Status cap = CheckLeaseCapLocked(*session);
      if (!cap.ok()) {
        memory_quota_.Release(device_key, size);
        UnchargeTensorLocked(batch[0].tensor);
        if (*memory != nullptr) effects.garbage.push_back(std::move(*memory));
        results.emplace_back(std::move(batch[0].done), cap);
      } else {
        results.emplace_back(std::move(batch[0].done),
                             RegisterLocked(*session, std::move(batch[0].tensor), std::move(*memory), size));
      }
    } else {
      const uint64_t arena_id = arenas_.AddArena(registry_, *session, ns, size, std::move(*memory));
      registry_.FindBuffer(arena_id)->device = &backends_->host();
      std::vector<QueuedAllocate> overflow;
      for (QueuedAllocate& entry : batch) {
        if (absl::Status cap = CheckLeaseCapLocked(*session); !cap.ok()) {
          UnchargeTensorLocked(entry.tensor);
          results.emplace_back(std::move(entry.done), cap);
        } else if (arenas_.PlaceInArena(registry_, *session, entry.tensor)) {
          results.emplace_back(std::move(entry.done), RegisterLocked(*session, std::move(entry.tensor), nullptr, 0));
        } else {
          overflow.push_back(std::move(entry));
        }
      }
      // The new arena is full: the first that did not fit makes the next, the rest wait for it.
      if (!overflow.empty()) {
        next_arena_bytes =
            arenas_.NextArenaBytes(registry_, *session, ns, ArenaSlots::SlotBytes(overflow[0].tensor.layout.extent));
        absl::Status reserved = ReserveArenaLocked(ns, next_arena_bytes, effects);
        if (!reserved.ok()) {
          for (QueuedAllocate& entry : overflow) {
            UnchargeTensorLocked(entry.tensor);
            results.emplace_back(std::move(entry.done), reserved);
          }
        } else {
          next_arena = std::move(overflow[0]);
          arenas_.StartMaking(session_id, ns);
          for (size_t k = 1; k < overflow.size(); ++k) arenas_.Enqueue(session_id, ns, std::move(overflow[k]));
        }
      }
    }
  }
  Deliver(effects);
  for (auto& [completion, result] : results) std::move(completion)(std::move(result));
  if (next_arena) {
    PostAllocation(session_id, next_arena_bytes, true, std::move(next_arena->tensor),
                   std::move(next_arena->done));
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
