#include "common/memory/level_zero/ze_importer.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/memory/level_zero/ze_handle.h"
#include "common/memory/level_zero/ze_stream_order.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "spdlog/spdlog.h"

namespace tensord::common {

// ---- ZeProcessContexts ----

class ZeProcessContexts::State {
 public:
  absl::Mutex mu;
  struct Entry {
    ze_context_handle_t context = nullptr;
    bool used = false;  // handed out: no longer replaceable
  };
  std::map<ze_driver_handle_t, Entry> by_driver ABSL_GUARDED_BY(mu);
};

ZeProcessContexts::ZeProcessContexts() : state_(new State()) {}

ZeProcessContexts& ZeProcessContexts::Get() {
  static auto* const contexts = new ZeProcessContexts();  // leaked: see the header
  return *contexts;
}

absl::Status ZeProcessContexts::Use(ze_driver_handle_t driver, ze_context_handle_t context) {
  if (driver == nullptr || context == nullptr) {
    return absl::InvalidArgumentError("use a Level Zero context: a null driver or context handle");
  }
  absl::MutexLock lock(&state_->mu);
  State::Entry& entry = state_->by_driver[driver];
  if (entry.used && entry.context != context) {
    return absl::FailedPreconditionError(
        "use a Level Zero context: tensord already uses another context of that driver in this process (hand "
        "yours over before the first Level Zero tensor is imported)");
  }
  entry.context = context;
  return absl::OkStatus();
}

absl::StatusOr<ze_context_handle_t> ZeProcessContexts::For(const ZeLoader& loader, ze_driver_handle_t driver) {
  absl::MutexLock lock(&state_->mu);
  State::Entry& entry = state_->by_driver[driver];
  if (entry.context == nullptr) {
    ze_context_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC;
    TENSORD_RETURN_IF_ERROR(
        ZeLoader::ZeStatus(loader.zeContextCreate(driver, &desc, &entry.context), "level_zero: zeContextCreate"));
  }
  entry.used = true;
  return entry.context;
}

// ---- the open cache ----

// This process's opens of buffers' allocations and of their ready-event pools, each keyed
// by the file of its fd and refcounted. Two maps, because two buffers may share one
// allocation (two exports from one producer block) but never a pool.
class ZeImporter::Opens {
 public:
  struct Key {
    dev_t dev = 0;
    ino_t ino = 0;
    auto operator<=>(const Key&) const = default;
  };
  struct Memory {
    void* base = nullptr;
    int refs = 0;
  };
  struct Pool {
    ze_event_pool_handle_t pool = nullptr;
    ze_event_handle_t ready = nullptr;
    std::unique_ptr<ZeRegionOrder> order;  // the regions' stream order
    int refs = 0;
  };
  // What one region holds.
  struct Held {
    const ZeLoader* loader = nullptr;
    ze_context_handle_t context = nullptr;
    Key memory_key;
    Key pool_key;
    void* base = nullptr;
    const ZeRegionOrder* order = nullptr;
  };

  static absl::StatusOr<Key> KeyOf(int fd, const std::string& what) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(what, ": fstat of a buffer's fd"));
    return Key{st.st_dev, st.st_ino};
  }

  // The buffer's allocation and pool, opened now where this process has not yet.
  absl::StatusOr<Held> Acquire(const ZeLoader& loader, const ZeDevice& device, ze_context_handle_t context,
                               const ZeHandle& handle, const FetchedBuffer& buffer, const std::string& what) {
    Held held;
    held.loader = &loader;
    held.context = context;
    TENSORD_ASSIGN_OR_RETURN(held.memory_key, KeyOf(buffer.handle.fds[0].get(), what));
    TENSORD_ASSIGN_OR_RETURN(held.pool_key, KeyOf(buffer.handle.fds[1].get(), what));
    absl::MutexLock lock(&mu_);
    Memory& memory = memories_[held.memory_key];
    if (memory.refs == 0) {
      ze_ipc_mem_handle_t ipc{};
      std::memcpy(ipc.data, handle.memory.data(), sizeof(ipc.data));
      absl::StatusOr<ze_ipc_mem_handle_t> with_fd = loader.MemoryHandleWithFd(context, ipc, buffer.handle.fds[0].get());
      absl::Status opened =
          with_fd.ok() ? ZeLoader::ZeStatus(loader.zeMemOpenIpcHandle(context, device.device, *with_fd, 0, &memory.base),
                                            absl::StrCat(what, ": zeMemOpenIpcHandle on ", ZeDeviceName(device)))
                       : with_fd.status();
      if (!opened.ok()) {
        memories_.erase(held.memory_key);
        return opened;
      }
    }
    ++memory.refs;
    held.base = memory.base;
    Pool& pool = pools_[held.pool_key];
    if (pool.refs == 0) {
      absl::Status opened = OpenPool(loader, context, handle, buffer.handle.fds[1].get(), pool, what);
      if (!opened.ok()) {
        ClosePool(loader, pool);
        pools_.erase(held.pool_key);
        ReleaseMemoryLocked(held);
        return opened;
      }
      pool.order = std::make_unique<ZeRegionOrder>(&loader, context, device.device, device.uuid, pool.ready);
    }
    ++pool.refs;
    held.order = pool.order.get();
    return held;
  }

  // Drops a region's references; the last of each closes it, under the lock, so a
  // concurrent Acquire never sees an open half-closed.
  void Release(const Held& held) {
    absl::MutexLock lock(&mu_);
    auto pool = pools_.find(held.pool_key);
    if (pool != pools_.end() && --pool->second.refs == 0) {
      ClosePool(*held.loader, pool->second);
      pools_.erase(pool);
    }
    ReleaseMemoryLocked(held);
  }

 private:
  void ReleaseMemoryLocked(const Held& held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto memory = memories_.find(held.memory_key);
    if (memory == memories_.end() || --memory->second.refs > 0) return;
    if (ze_result_t r = held.loader->zeMemCloseIpcHandle(held.context, memory->second.base); r != ZE_RESULT_SUCCESS) {
      spdlog::error("level_zero: close an IPC open: {}", ZeLoader::ResultName(r));
    }
    memories_.erase(memory);
  }

  static absl::Status OpenPool(const ZeLoader& loader, ze_context_handle_t context, const ZeHandle& handle, int fd,
                               Pool& pool, const std::string& what) {
    ze_ipc_event_pool_handle_t ipc{};
    std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> bytes = handle.event_pool;
    SetIpcFd(bytes, fd);
    std::memcpy(ipc.data, bytes.data(), sizeof(ipc.data));
    TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(loader.zeEventPoolOpenIpcHandle(context, ipc, &pool.pool),
                                               absl::StrCat(what, ": zeEventPoolOpenIpcHandle")));
    ze_event_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_EVENT_DESC;
    desc.index = 0;
    desc.signal = ZE_EVENT_SCOPE_FLAG_HOST;
    desc.wait = ZE_EVENT_SCOPE_FLAG_HOST;
    return ZeLoader::ZeStatus(loader.zeEventCreate(pool.pool, &desc, &pool.ready),
                              absl::StrCat(what, ": zeEventCreate of the ready event"));
  }

  static void ClosePool(const ZeLoader& ze, Pool& pool) {
    if (pool.ready != nullptr) {
      if (ze_result_t r = ze.zeEventDestroy(pool.ready); r != ZE_RESULT_SUCCESS) {
        spdlog::error("level_zero: destroy a ready event: {}", ZeLoader::ResultName(r));
      }
    }
    if (pool.pool != nullptr) {
      if (ze_result_t r = ze.zeEventPoolCloseIpcHandle(pool.pool); r != ZE_RESULT_SUCCESS) {
        spdlog::error("level_zero: close a ready-event pool: {}", ZeLoader::ResultName(r));
      }
    }
  }

  absl::Mutex mu_;
  std::map<Key, Memory> memories_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Pool> pools_ ABSL_GUARDED_BY(mu_);
};

namespace {

class ZeRegion final : public ImportedRegion {
 public:
  ZeRegion(std::shared_ptr<ZeImporter::Opens> opens, ZeImporter::Opens::Held held, uint8_t* data, uint64_t size,
           MapMode mode, int32_t ordinal)
      : opens_(std::move(opens)), held_(held), data_(data), size_(size), mode_(mode), ordinal_(ordinal) {}
  ~ZeRegion() override { opens_->Release(held_); }
  uint8_t* data() const override { return data_; }
  uint64_t size() const override { return size_; }
  MapMode mode() const override { return mode_; }
  int32_t device_ordinal() const override { return ordinal_; }
  // Alive while this region holds its pool.
  const StreamOrder* stream_order() const override { return held_.order; }

 private:
  const std::shared_ptr<ZeImporter::Opens> opens_;
  const ZeImporter::Opens::Held held_;
  uint8_t* const data_;
  const uint64_t size_;
  const MapMode mode_;
  const int32_t ordinal_;
};

}  // namespace

// ---- ZeImporter ----

ZeImporter::ZeImporter() : ZeImporter(nullptr) {}
ZeImporter::ZeImporter(const ZeLoader* loader) : loader_(loader), opens_(std::make_shared<Opens>()) {}
ZeImporter::~ZeImporter() = default;

const ZeLoader& ZeImporter::loader() const { return loader_ != nullptr ? *loader_ : ZeLoader::Get(); }

absl::StatusOr<std::unique_ptr<ImportedRegion>> ZeImporter::Import(const FetchedBuffer& buffer, MapMode mode,
                                                                   const std::string& what) {
  const ZeLoader& ze = loader();
  if (!ze.available()) return absl::UnavailableError(absl::StrCat(what, ": level_zero: ", ze.unavailable_reason()));
  if (buffer.device_type != tensord::v1::DEVICE_TYPE_ONEAPI) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a level_zero buffer (device type ",
                                                   static_cast<int>(buffer.device_type), ")"));
  }
  absl::StatusOr<ZeHandle> handle = DecodeZeHandle(buffer.handle.data);
  if (!handle.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", handle.status().message()));
  // The daemon hands out handles with their ready-event pool, always.
  if (!handle->has_event_pool || buffer.handle.fds.size() != handle->fd_count()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a level_zero buffer comes with 2 fds (memory and "
                                                   "ready-event pool), got ",
                                                   buffer.handle.fds.size()));
  }
  if (handle->size - handle->offset < buffer.size) {
    return absl::DataLossError(absl::StrCat(what, ": the handle backs ", handle->size - handle->offset,
                                            " bytes, the broker says the buffer holds ", buffer.size));
  }
  absl::StatusOr<const ZeDevice*> device = ze.DeviceByUuid(handle->uuid);
  if (!device.ok()) return absl::Status(device.status().code(), absl::StrCat(what, ": ", device.status().message()));
  TENSORD_ASSIGN_OR_RETURN(ze_context_handle_t context, ZeProcessContexts::Get().For(ze, (*device)->driver));
  TENSORD_ASSIGN_OR_RETURN(Opens::Held held, opens_->Acquire(ze, **device, context, *handle, buffer, what));
  auto* data = static_cast<uint8_t*>(held.base) + handle->offset;
  return std::make_unique<ZeRegion>(opens_, held, data, buffer.size, mode, (*device)->ordinal);
}

absl::Status ZeImporter::NameDevice(tensord::v1::Device& device) const {
  TENSORD_ASSIGN_OR_RETURN(const ZeDevice* d, loader().DeviceByOrdinal(device.index()));
  device.set_uuid(d->uuid);
  return absl::OkStatus();
}

absl::StatusOr<MemoryHandle> ZeImporter::ExportExisting(const void* ptr, uint64_t bytes,
                                                        const tensord::v1::Device& device,
                                                        const std::string& what) const {
  const ZeLoader& ze = loader();
  TENSORD_ASSIGN_OR_RETURN(const ZeDevice* d, ze.DeviceByOrdinal(device.index()));
  TENSORD_ASSIGN_OR_RETURN(ze_context_handle_t context, ZeProcessContexts::Get().For(ze, d->driver));
  ze_memory_allocation_properties_t props{};
  props.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES;
  ze_device_handle_t owner = nullptr;
  TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(ze.zeMemGetAllocProperties(context, ptr, &props, &owner),
                                             absl::StrCat(what, ": zeMemGetAllocProperties")));
  if (props.type != ZE_MEMORY_TYPE_DEVICE || owner != d->device) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the pointer is not device memory of ", ZeDeviceName(*d),
        " in tensord's Level Zero context (allocate it with zeMemAllocDevice in the context handed over with "
        "UseLevelZeroContext)"));
  }
  void* base = nullptr;
  size_t size = 0;
  TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(ze.zeMemGetAddressRange(context, ptr, &base, &size),
                                             absl::StrCat(what, ": zeMemGetAddressRange")));
  const uint64_t offset = static_cast<uint64_t>(static_cast<const uint8_t*>(ptr) - static_cast<const uint8_t*>(base));
  if (offset >= size || bytes > size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", bytes, " bytes at offset ", offset,
                                                   " run past the end of the allocation of ", size, " bytes"));
  }
  ze_ipc_mem_handle_t ipc{};
  TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(ze.zeMemGetIpcHandle(context, base, &ipc),
                                             absl::StrCat(what, ": zeMemGetIpcHandle")));
  const int driver_fd = ze.MemoryFdOf(context, ipc);
  UniqueFd fd(driver_fd >= 0 ? ::fcntl(driver_fd, F_DUPFD_CLOEXEC, 0) : -1);
  if (!fd.valid()) return absl::InternalError(absl::StrCat(what, ": the driver's IPC handle holds no usable fd"));
  ZeHandle handle;
  handle.kind = ZeHandleKind::kProducerExport;
  handle.uuid = d->uuid;
  handle.size = size;
  handle.offset = offset;
  std::memcpy(handle.memory.data(), ipc.data, handle.memory.size());
  SetIpcFd(handle.memory, 0);
  MemoryHandle out;
  out.data = EncodeZeHandle(handle);
  out.fds.push_back(std::move(fd));
  return out;
}

const StreamOrder* ZeImporter::stream_order() const {
  static const ZeRegionOrder* const order = new ZeRegionOrder(&ZeLoader::Get());
  return order;
}

}  // namespace tensord::common
