// The Broker's side of a take-over (tensord --take-over): the old daemon freezes its names
// and snapshots every bound tensor with the memory behind it; the new one restores them,
// checking each entry, before it serves anyone. Sessions, leases, waits, watches and
// hand-over tokens are not carried: clients reconnect and acquire again.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/memory/device_names.h"
#include "common/names.h"
#include "common/status.h"
#include "common/tensor_desc.h"
#include "server/broker/broker.h"
#include "server/state/registry_snapshot.h"
#include "spdlog/spdlog.h"

namespace tensord::server {

namespace v1 = tensord::v1;

absl::Status Broker::CheckNamesMayChangeLocked() const {
  if (!frozen_) return absl::OkStatus();
  return absl::UnavailableError(
      "a new tensord is taking over from this one: names cannot change now; reconnect and try again");
}

Broker::Snapshot Broker::FreezeAndSnapshot() {
  absl::MutexLock lock(&mu_);
  frozen_ = true;
  return SnapshotLocked(nullptr);
}

Broker::Snapshot Broker::SnapshotForStore(const std::set<uint64_t>& stored) {
  absl::MutexLock lock(&mu_);
  return SnapshotLocked(&stored);
}

namespace {

// A bound tensor as the snapshot carries it.
void AddSnapshotTensor(const std::string& name, const Tensor& tensor, v1::RegistrySnapshot& registry) {
  v1::SnapshotTensor& entry = *registry.add_tensors();
  entry.set_name(name);
  entry.set_generation(tensor.generation);
  *entry.mutable_desc() = tensor.desc;
  entry.mutable_tags()->insert(tensor.tags.begin(), tensor.tags.end());
  entry.set_producer_uid(tensor.producer_uid);
  entry.set_created_unix_ms(tensor.created_unix_ms);
  entry.set_buffer_id(tensor.buffer_id);
  entry.set_offset(tensor.offset);
  if (tensor.ttl_timer != 0) entry.set_expires_unix_ms(tensor.ttl_deadline_unix_ms);
  entry.set_queue_prefix(tensor.queue_prefix);
}

}  // namespace

Broker::Snapshot Broker::SnapshotLocked(const std::set<uint64_t>* stored) {
  Snapshot out;
  out.registry.set_last_generation(registry_.last_generation());
  out.registry.set_taken_unix_ms(NowUnixMs());
  std::set<uint64_t> carried;  // buffers already in the snapshot
  for (const auto& [name, tensor_id] : registry_.names()) {
    const Tensor* tensor = registry_.Find(tensor_id);
    if (tensor == nullptr || tensor->state != v1::TENSOR_STATE_SEALED) continue;
    if (tensor->buffer_id != 0 && !carried.contains(tensor->buffer_id)) {
      if (absl::Status buffer = SnapshotBufferLocked(tensor->buffer_id, stored, out); !buffer.ok()) {
        spdlog::warn("take-over: {} (generation {}) is not carried: {}", name, tensor->generation,
                     std::string(buffer.message()));
        ++out.dropped;
        continue;
      }
      carried.insert(tensor->buffer_id);
    }
    AddSnapshotTensor(name, *tensor, out.registry);
  }
  return out;
}

absl::Status Broker::SnapshotBufferLocked(uint64_t buffer_id, const std::set<uint64_t>* stored, Snapshot& out) {
  const Buffer* buffer = registry_.FindBuffer(buffer_id);
  if (buffer == nullptr) return absl::NotFoundError("its buffer is gone");
  if (!buffer->producer_exited.empty() || buffer->memory->OwnedByProducer()) {
    return absl::FailedPreconditionError("its memory is its producer's, not the daemon's");
  }
  if (!buffer->device->backend->Restorable()) {
    return absl::FailedPreconditionError(
        absl::StrCat(std::string(buffer->device->backend->name()), " memory cannot be carried to a new daemon"));
  }
  const bool in_store = stored != nullptr && stored->contains(buffer->id);
  common::MemoryHandle handle;  // none for a buffer in the store: its fds are there already
  if (!in_store) {
    TENSORD_ASSIGN_OR_RETURN(handle, buffer->memory->Export());
  }
  v1::SnapshotBuffer& entry = *out.registry.add_buffers();
  entry.set_id(buffer->id);
  entry.set_backend(std::string(buffer->device->backend->name()));
  *entry.mutable_device() = buffer->device->device.device;
  entry.set_size(buffer->size);
  entry.set_handle(handle.data);
  entry.set_first_fd(static_cast<uint32_t>(out.fds.size()));
  entry.set_fd_count(static_cast<uint32_t>(handle.fds.size()));
  // A host buffer has one fd; names for every fd its backend's handle may hold.
  const size_t fd_names = in_store ? 1 : handle.fds.size();
  for (size_t i = 0; i < fd_names; ++i) entry.add_fd_names(StoredFdName(buffer->id, i));
  for (common::UniqueFd& fd : handle.fds) out.fds.push_back(std::move(fd));
  return absl::OkStatus();
}

void Broker::Unfreeze() {
  absl::MutexLock lock(&mu_);
  frozen_ = false;
}

namespace {

using SnapshotTensors = std::vector<const v1::SnapshotTensor*>;

// Logs why the restore did not take `what`, and counts it with the `more` entries that go with it.
void Refuse(Broker::RestoreReport& report, const std::string& what, absl::string_view why, uint64_t more = 0) {
  spdlog::warn("take-over: {} refused: {}", what, std::string(why));
  report.refused += 1 + more;
}

// The snapshot's tensors that may be restored, by the buffer they are in: a valid name, given
// once, a generation the snapshot could have given, a TTL not yet run out.
std::map<uint64_t, SnapshotTensors> TensorsByBuffer(const v1::RegistrySnapshot& snapshot, int64_t now,
                                                   Broker::RestoreReport& report) {
  std::map<uint64_t, SnapshotTensors> by_buffer;
  std::set<std::string> names;
  for (const v1::SnapshotTensor& entry : snapshot.tensors()) {
    const std::string what = absl::StrCat("tensor ", common::QuoteForError(entry.name()));
    if (absl::Status valid = common::ValidateName(entry.name()); !valid.ok()) {
      Refuse(report, what, valid.message());
    } else if (!names.insert(entry.name()).second) {
      Refuse(report, what, "its name comes twice");
    } else if (entry.generation() == 0 || entry.generation() > snapshot.last_generation()) {
      Refuse(report, what,
             absl::StrCat("generation ", entry.generation(), " is outside 1..", snapshot.last_generation()));
    } else if (entry.expires_unix_ms() != 0 && entry.expires_unix_ms() <= now) {
      Refuse(report, what, "its TTL ran out during the hand-over");
    } else {
      by_buffer[entry.buffer_id()].push_back(&entry);
    }
  }
  return by_buffer;
}

// The snapshot's buffers by id; an id of 0 or one given twice is refused.
std::map<uint64_t, const v1::SnapshotBuffer*> BuffersById(const v1::RegistrySnapshot& snapshot,
                                                          Broker::RestoreReport& report) {
  std::map<uint64_t, const v1::SnapshotBuffer*> buffers;
  for (const v1::SnapshotBuffer& buffer : snapshot.buffers()) {
    if (buffer.id() == 0 || !buffers.emplace(buffer.id(), &buffer).second) {
      Refuse(report, absl::StrCat("buffer ", buffer.id()), "its id is 0 or comes twice");
    }
  }
  return buffers;
}

// A snapshot tensor as this daemon holds it, checked against the buffer it is restored in
// (on `device`, `size` bytes; none: `has_memory` false).
absl::StatusOr<Tensor> RestoredTensor(const v1::SnapshotTensor& entry, const ResolvedDevice& device, uint64_t size,
                                      bool has_memory, const std::string& what) {
  TENSORD_ASSIGN_OR_RETURN(common::TensorLayout layout, common::ValidateDesc(entry.desc()));
  if (common::DeviceKey(entry.desc().device()) != common::DeviceKey(device.device.device)) {
    return absl::FailedPreconditionError("its description names another device than its buffer's");
  }
  if (has_memory) {
    v1::BufferRef ref;
    ref.set_size(size);
    ref.set_offset(entry.offset());
    TENSORD_RETURN_IF_ERROR(common::ValidateFitsBuffer(layout, ref, what));
  } else if (layout.extent != 0) {
    return absl::FailedPreconditionError("it has elements but no buffer");
  }
  Tensor tensor;
  tensor.ns = std::string(common::NamespaceOf(entry.name()));
  tensor.desc = entry.desc();
  tensor.device = &device;
  tensor.layout = layout;
  tensor.offset = entry.offset();
  tensor.tags.insert(entry.tags().begin(), entry.tags().end());
  tensor.created_unix_ms = entry.created_unix_ms();
  tensor.producer_uid = entry.producer_uid();
  tensor.name = entry.name();  // for the metadata charge
  return tensor;
}

}  // namespace

Broker::RestoreReport Broker::Restore(const v1::RegistrySnapshot& snapshot, std::vector<common::UniqueFd> fds) {
  RestoreReport report;
  const int64_t now = NowUnixMs();
  Effects effects;  // empty: nothing is pooled before the broker serves
  absl::MutexLock lock(&mu_);
  registry_.ContinueGenerationsAfter(snapshot.last_generation());
  // The tensors of each buffer, checked first: a buffer enters only with a tensor in it.
  const std::map<uint64_t, SnapshotTensors> by_buffer = TensorsByBuffer(snapshot, now, report);
  const std::map<uint64_t, const v1::SnapshotBuffer*> buffers = BuffersById(snapshot, report);
  for (const auto& [buffer_id, entries] : by_buffer) {
    const std::string what = absl::StrCat("buffer ", buffer_id, " (", entries.size(), " tensors)");
    RestoredBuffer buffer{&backends_->host(), nullptr, 0};  // tensors of no bytes
    if (buffer_id != 0) {
      absl::StatusOr<RestoredBuffer> restored = RestoreBufferLocked(buffers, buffer_id, fds, what, effects);
      if (!restored.ok()) {
        Refuse(report, what, restored.status().message(), entries.size() - 1);
        continue;
      }
      buffer = *std::move(restored);
    }
    std::vector<std::pair<Tensor, const v1::SnapshotTensor*>> accepted = ChargeRestoredLocked(entries, buffer, report);
    if (accepted.empty()) {
      if (buffer.memory != nullptr) memory_quota_.Release(buffer.device->key, buffer.size);
      continue;
    }
    AddRestoredLocked(std::move(buffer), std::move(accepted), now, report);
  }
  return report;
}

absl::StatusOr<Broker::RestoredBuffer> Broker::RestoreBufferLocked(
    const std::map<uint64_t, const v1::SnapshotBuffer*>& buffers, uint64_t buffer_id,
    std::vector<common::UniqueFd>& fds, const std::string& what, Effects& effects) {
  auto it = buffers.find(buffer_id);
  if (it == buffers.end()) return absl::NotFoundError("no such buffer in the snapshot");
  const v1::SnapshotBuffer& entry = *it->second;
  TENSORD_ASSIGN_OR_RETURN(const ResolvedDevice* device, backends_->Resolve(entry.device()));
  if (device->backend->name() != entry.backend()) {
    return absl::FailedPreconditionError(absl::StrCat("its device is ", std::string(device->backend->name()),
                                                      "'s here, ", entry.backend(), "'s there"));
  }
  const uint64_t first = entry.first_fd(), count = entry.fd_count();
  if (first > fds.size() || count > fds.size() - first) {
    return absl::FailedPreconditionError(
        absl::StrCat("its fds ", first, "..", first + count, " are not among the ", fds.size(), " that came"));
  }
  common::MemoryHandle handle;
  handle.data = entry.handle();
  for (uint64_t i = first; i < first + count; ++i) handle.fds.push_back(std::move(fds[i]));
  TENSORD_ASSIGN_OR_RETURN(std::unique_ptr<common::BackendBuffer> memory,
                           device->backend->Restore(device->device, std::move(handle), entry.size(), what));
  TENSORD_RETURN_IF_ERROR(ReserveLocked(*device, entry.size(), what, effects));
  return RestoredBuffer{device, std::move(memory), entry.size()};
}

std::vector<std::pair<Tensor, const v1::SnapshotTensor*>> Broker::ChargeRestoredLocked(
    const std::vector<const v1::SnapshotTensor*>& entries, const RestoredBuffer& buffer, RestoreReport& report) {
  std::vector<std::pair<Tensor, const v1::SnapshotTensor*>> accepted;
  for (const v1::SnapshotTensor* entry : entries) {
    const std::string what = absl::StrCat("tensor ", common::QuoteForError(entry->name()));
    absl::StatusOr<Tensor> tensor =
        RestoredTensor(*entry, *buffer.device, buffer.size, buffer.memory != nullptr, what);
    absl::Status status = tensor.status();
    if (status.ok()) {
      // A buffer of one tensor counts its size against the producer's uid, as at
      // allocation; a shared one (an arena) counts each tensor's own bytes.
      const uint64_t charged = entries.size() == 1 ? buffer.size : tensor->layout.extent;
      const uint64_t uid_host_bytes =
          buffer.device == &backends_->host() ? access_.UidHostBytes(tensor->ns, charged) : 0;
      status = ChargeTensorLocked(*tensor, uid_host_bytes, what);
    }
    if (!status.ok()) {
      Refuse(report, what, status.message());
      continue;
    }
    accepted.emplace_back(*std::move(tensor), entry);
  }
  return accepted;
}

void Broker::AddRestoredLocked(RestoredBuffer buffer,
                               std::vector<std::pair<Tensor, const v1::SnapshotTensor*>> accepted, int64_t now,
                               RestoreReport& report) {
  if (buffer.memory != nullptr) {
    Buffer added;
    added.id = registry_.NextBufferId();
    added.size = buffer.size;
    added.memory = std::move(buffer.memory);
    added.device = buffer.device;
    added.reader_sealed = true;  // Restore checked the reader seals
    for (auto& [tensor, entry] : accepted) tensor.buffer_id = added.id;
    registry_.AddBuffer(std::move(added));
    ++report.buffers;
    report.bytes += buffer.size;
  }
  for (auto& [tensor, entry] : accepted) {
    tensor.id = registry_.NextTensorId();
    tensor.state = v1::TENSOR_STATE_SEALED;
    tensor.name.clear();  // Bind sets it
    // Still in its queue, as the old daemon counted it: a slot of the queue it is bound in.
    const std::string& prefix = entry->queue_prefix();
    const size_t slash = entry->name().rfind('/');
    if (!prefix.empty() && slash != std::string::npos && entry->name().compare(0, slash + 1, prefix) == 0) {
      tensor.queue_prefix = prefix;
      queue_slots_.Hold(prefix);
    }
    Tensor& restored = registry_.AddTensor(std::move(tensor));
    registry_.Bind(entry->name(), restored, entry->generation());
    names_version_.fetch_add(1, std::memory_order_release);
    if (entry->expires_unix_ms() != 0) {
      ScheduleTtlLocked(restored, static_cast<uint64_t>(std::max<int64_t>(1, entry->expires_unix_ms() - now)));
    }
    ++report.tensors;
  }
}

}  // namespace tensord::server
