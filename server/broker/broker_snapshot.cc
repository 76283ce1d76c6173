// The Broker's side of a take-over (tensord --take-over): the old daemon freezes its names
// and snapshots every bound tensor with the memory behind it; the new one restores them,
// checking each entry, before it serves anyone. Sessions, leases, waits, watches and
// hand-over tokens are not carried: clients reconnect and acquire again.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
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

Broker::Snapshot Broker::SnapshotLocked(const std::set<uint64_t>* stored) {
  Snapshot out;
  out.registry.set_last_generation(registry_.last_generation());
  out.registry.set_taken_unix_ms(NowUnixMs());
  std::set<uint64_t> carried;  // buffers already in the snapshot
  for (const auto& [name, tensor_id] : registry_.names()) {
    const Tensor* tensor = registry_.Find(tensor_id);
    if (tensor == nullptr || tensor->state != v1::TENSOR_STATE_SEALED) continue;
    if (tensor->buffer_id != 0 && !carried.contains(tensor->buffer_id)) {
      const Buffer* buffer = registry_.FindBuffer(tensor->buffer_id);
      std::string why;
      absl::StatusOr<common::MemoryHandle> handle;
      if (buffer == nullptr) {
        why = "its buffer is gone";
      } else if (!buffer->producer_exited.empty() || buffer->memory->OwnedByProducer()) {
        why = "its memory is its producer's, not the daemon's";
      } else if (!buffer->device->backend->Restorable()) {
        why = absl::StrCat(std::string(buffer->device->backend->name()), " memory cannot be carried to a new daemon");
      } else if (stored != nullptr && stored->contains(buffer->id)) {
        handle = common::MemoryHandle{};  // its fds are in the store already
      } else if (handle = buffer->memory->Export(); !handle.ok()) {
        why = std::string(handle.status().message());
      }
      if (!why.empty()) {
        spdlog::warn("take-over: {} (generation {}) is not carried: {}", name, tensor->generation, why);
        ++out.dropped;
        continue;
      }
      v1::SnapshotBuffer& entry = *out.registry.add_buffers();
      entry.set_id(buffer->id);
      entry.set_backend(std::string(buffer->device->backend->name()));
      *entry.mutable_device() = buffer->device->device.device;
      entry.set_size(buffer->size);
      entry.set_handle(handle->data);
      entry.set_first_fd(static_cast<uint32_t>(out.fds.size()));
      entry.set_fd_count(static_cast<uint32_t>(handle->fds.size()));
      // A host buffer has one fd; names for every fd its backend's handle may hold.
      const size_t fd_names = stored != nullptr && stored->contains(buffer->id) ? 1 : handle->fds.size();
      for (size_t i = 0; i < fd_names; ++i) entry.add_fd_names(StoredFdName(buffer->id, i));
      for (common::UniqueFd& fd : handle->fds) out.fds.push_back(std::move(fd));
      carried.insert(buffer->id);
    }
    v1::SnapshotTensor& entry = *out.registry.add_tensors();
    entry.set_name(name);
    entry.set_generation(tensor->generation);
    *entry.mutable_desc() = tensor->desc;
    entry.mutable_tags()->insert(tensor->tags.begin(), tensor->tags.end());
    entry.set_producer_uid(tensor->producer_uid);
    entry.set_created_unix_ms(tensor->created_unix_ms);
    entry.set_buffer_id(tensor->buffer_id);
    entry.set_offset(tensor->offset);
    if (tensor->ttl_timer != 0) entry.set_expires_unix_ms(tensor->ttl_deadline_unix_ms);
  }
  return out;
}

void Broker::Unfreeze() {
  absl::MutexLock lock(&mu_);
  frozen_ = false;
}

Broker::RestoreReport Broker::Restore(const v1::RegistrySnapshot& snapshot, std::vector<common::UniqueFd> fds) {
  RestoreReport report;
  const int64_t now = NowUnixMs();
  auto refuse = [&](const std::string& what, const auto& why) {
    spdlog::warn("take-over: {} refused: {}", what, std::string(why));
    ++report.refused;
  };
  // The tensors of each buffer, checked first: a buffer enters only with a tensor in it.
  std::map<uint64_t, std::vector<const v1::SnapshotTensor*>> by_buffer;
  Effects effects;  // empty: nothing is pooled before the broker serves
  absl::MutexLock lock(&mu_);
  registry_.ContinueGenerationsAfter(snapshot.last_generation());
  std::set<std::string> names;
  for (const v1::SnapshotTensor& entry : snapshot.tensors()) {
    const std::string what = absl::StrCat("tensor ", common::QuoteForError(entry.name()));
    if (absl::Status valid = common::ValidateName(entry.name()); !valid.ok()) {
      refuse(what, valid.message());
    } else if (!names.insert(entry.name()).second) {
      refuse(what, "its name comes twice");
    } else if (entry.generation() == 0 || entry.generation() > snapshot.last_generation()) {
      refuse(what, absl::StrCat("generation ", entry.generation(), " is outside 1..", snapshot.last_generation()));
    } else if (entry.expires_unix_ms() != 0 && entry.expires_unix_ms() <= now) {
      refuse(what, "its TTL ran out during the hand-over");
    } else {
      by_buffer[entry.buffer_id()].push_back(&entry);
    }
  }
  std::map<uint64_t, const v1::SnapshotBuffer*> buffers;
  for (const v1::SnapshotBuffer& buffer : snapshot.buffers()) {
    if (buffer.id() == 0 || !buffers.emplace(buffer.id(), &buffer).second) {
      refuse(absl::StrCat("buffer ", buffer.id()), "its id is 0 or comes twice");
    }
  }

  for (auto& [buffer_id, entries] : by_buffer) {
    const std::string buffer_what = absl::StrCat("buffer ", buffer_id, " (", entries.size(), " tensors)");
    const ResolvedDevice* device = &backends_->host();
    std::unique_ptr<common::BackendBuffer> memory;
    uint64_t size = 0;
    if (buffer_id != 0) {
      auto it = buffers.find(buffer_id);
      if (it == buffers.end()) {
        refuse(buffer_what, "no such buffer in the snapshot");
        report.refused += entries.size() - 1;
        continue;
      }
      const v1::SnapshotBuffer& entry = *it->second;
      absl::StatusOr<const ResolvedDevice*> resolved = backends_->Resolve(entry.device());
      absl::Status status = resolved.status();
      if (status.ok() && (*resolved)->backend->name() != entry.backend()) {
        status = absl::FailedPreconditionError(absl::StrCat("its device is ", std::string((*resolved)->backend->name()),
                                                            "'s here, ", entry.backend(), "'s there"));
      }
      const uint64_t first = entry.first_fd(), count = entry.fd_count();
      if (status.ok() && (first > fds.size() || count > fds.size() - first)) {
        status = absl::FailedPreconditionError(absl::StrCat("its fds ", first, "..", first + count, " are not among the ",
                                                            fds.size(), " that came"));
      }
      if (status.ok()) {
        device = *resolved;
        common::MemoryHandle handle;
        handle.data = entry.handle();
        for (uint64_t i = first; i < first + count; ++i) handle.fds.push_back(std::move(fds[i]));
        absl::StatusOr<std::unique_ptr<common::BackendBuffer>> restored =
            device->backend->Restore(device->device, std::move(handle), entry.size(), buffer_what);
        status = restored.status();
        if (restored.ok()) memory = *std::move(restored);
      }
      if (status.ok()) status = ReserveLocked(*device, entry.size(), buffer_what, effects);
      if (!status.ok()) {
        refuse(buffer_what, status.message());
        report.refused += entries.size() - 1;
        continue;
      }
      size = entry.size();
    }

    std::vector<std::pair<Tensor, const v1::SnapshotTensor*>> accepted;
    for (const v1::SnapshotTensor* entry : entries) {
      const std::string what = absl::StrCat("tensor ", common::QuoteForError(entry->name()));
      absl::StatusOr<common::TensorLayout> layout = common::ValidateDesc(entry->desc());
      absl::Status status = layout.status();
      if (status.ok() && common::DeviceKey(entry->desc().device()) != common::DeviceKey(device->device.device)) {
        status = absl::FailedPreconditionError("its description names another device than its buffer's");
      }
      if (status.ok() && memory != nullptr) {
        v1::BufferRef ref;
        ref.set_size(size);
        ref.set_offset(entry->offset());
        status = common::ValidateFitsBuffer(*layout, ref, what);
      } else if (status.ok() && layout->extent != 0) {
        status = absl::FailedPreconditionError("it has elements but no buffer");
      }
      if (!status.ok()) {
        refuse(what, status.message());
        continue;
      }
      Tensor tensor;
      tensor.ns = std::string(common::NamespaceOf(entry->name()));
      tensor.desc = entry->desc();
      tensor.device = device;
      tensor.layout = *layout;
      tensor.offset = entry->offset();
      tensor.tags.insert(entry->tags().begin(), entry->tags().end());
      tensor.created_unix_ms = entry->created_unix_ms();
      tensor.producer_uid = entry->producer_uid();
      tensor.name = entry->name();  // for the metadata charge
      // A buffer of one tensor counts its size against the producer's uid, as at
      // allocation; a shared one (an arena) counts each tensor's own bytes.
      const uint64_t charged = entries.size() == 1 ? size : layout->extent;
      const uint64_t uid_host_bytes = device == &backends_->host() ? access_.UidHostBytes(tensor.ns, charged) : 0;
      if (absl::Status charged_status = ChargeTensorLocked(tensor, uid_host_bytes, what); !charged_status.ok()) {
        refuse(what, charged_status.message());
        continue;
      }
      accepted.emplace_back(std::move(tensor), entry);
    }
    if (accepted.empty()) {
      if (memory != nullptr) memory_quota_.Release(device->key, size);
      continue;
    }
    if (memory != nullptr) {
      Buffer buffer;
      buffer.id = registry_.NextBufferId();
      buffer.size = size;
      buffer.memory = std::move(memory);
      buffer.device = device;
      buffer.reader_sealed = true;  // Restore checked the reader seals
      for (auto& [tensor, entry] : accepted) tensor.buffer_id = buffer.id;
      registry_.AddBuffer(std::move(buffer));
      ++report.buffers;
      report.bytes += size;
    }
    for (auto& [tensor, entry] : accepted) {
      tensor.id = registry_.NextTensorId();
      tensor.state = v1::TENSOR_STATE_SEALED;
      tensor.name.clear();  // Bind sets it
      Tensor& added = registry_.AddTensor(std::move(tensor));
      registry_.Bind(entry->name(), added, entry->generation());
      names_version_.fetch_add(1, std::memory_order_release);
      if (entry->expires_unix_ms() != 0) {
        ScheduleTtlLocked(added, static_cast<uint64_t>(std::max<int64_t>(1, entry->expires_unix_ms() - now)));
      }
      ++report.tensors;
    }
  }
  return report;
}

}  // namespace tensord::server
