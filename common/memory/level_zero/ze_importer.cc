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

// This process's opens of buffers' allocations and ready-event pools, by the file of
// their fds, refcounted. One Open per allocation, however many regions and modes.
class ZeImporter::Opens {
 public:
  struct Key {
    dev_t dev = 0;
    ino_t ino = 0;
    auto operator<=>(const Key&) const = default;
  };
  struct Open {
    const ZeLoader* loader = nullptr;
    ze_context_handle_t context = nullptr;
    ze_device_handle_t device = nullptr;
    void* base = nullptr;
    ze_event_pool_handle_t pool = nullptr;
    ze_event_handle_t ready = nullptr;
    // Lives as long as the open: the regions' stream order.
    std::unique_ptr<ZeRegionOrder> order;
    int refs = 0;
  };

  static absl::StatusOr<Key> KeyOf(int fd, const std::string& what) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(what, ": fstat of the buffer's fd"));
    return Key{st.st_dev, st.st_ino};
  }

  // The open of the allocation `key` names, made now if there is none.
  absl::StatusOr<Open*> Acquire(const ZeLoader& loader, const Key& key, const ZeDevice& device,
                                ze_context_handle_t context, const ZeHandle& handle, const FetchedBuffer& buffer,
                                const std::string& what) {
    absl::MutexLock lock(&mu_);
    auto it = opens_.find(key);
    if (it != opens_.end()) {
      ++it->second->refs;
      return it->second.get();
    }
    auto open = std::make_unique<Open>();
    open->loader = &loader;
    open->context = context;
    open->device = device.device;
    ze_ipc_mem_handle_t ipc{};
    std::memcpy(ipc.data, handle.memory.data(), sizeof(ipc.data));
    TENSORD_ASSIGN_OR_RETURN(ipc, loader.MemoryHandleWithFd(context, ipc, buffer.handle.fds[0].get()));
    TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(loader.zeMemOpenIpcHandle(context, device.device, ipc, 0, &open->base),
                                               absl::StrCat(what, ": zeMemOpenIpcHandle on ", ZeDeviceName(device))));
    if (absl::Status pool = OpenPool(loader, *open, handle, buffer.handle.fds[1].get(), what); !pool.ok()) {
      Close(*open);
      return pool;
    }
    open->order = std::make_unique<ZeRegionOrder>(&loader, context, device.device, device.uuid, open->ready);
    open->refs = 1;
    Open* raw = open.get();
    opens_.emplace(key, std::move(open));
    return raw;
  }

  // Drops one reference; the last closes the open, under the lock, so a concurrent Acquire
  // of the same allocation never sees it half-closed.
  void Release(const Key& key) {
    absl::MutexLock lock(&mu_);
    auto it = opens_.find(key);
    if (it == opens_.end() || --it->second->refs > 0) return;
    Close(*it->second);
    opens_.erase(it);
  }

  int64_t size() {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(opens_.size());
  }

 private:
  static absl::Status OpenPool(const ZeLoader& loader, Open& open, const ZeHandle& handle, int fd,
                               const std::string& what) {
    ze_ipc_event_pool_handle_t ipc{};
    std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> bytes = handle.event_pool;
    SetIpcFd(bytes, fd);
    std::memcpy(ipc.data, bytes.data(), sizeof(ipc.data));
    TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(loader.zeEventPoolOpenIpcHandle(open.context, ipc, &open.pool),
                                               absl::StrCat(what, ": zeEventPoolOpenIpcHandle")));
    ze_event_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_EVENT_DESC;
    desc.index = 0;
    desc.signal = ZE_EVENT_SCOPE_FLAG_HOST;
    desc.wait = ZE_EVENT_SCOPE_FLAG_HOST;
    return ZeLoader::ZeStatus(loader.zeEventCreate(open.pool, &desc, &open.ready),
                              absl::StrCat(what, ": zeEventCreate of the ready event"));
  }

  static void Close(Open& open) {
    const ZeLoader& ze = *open.loader;
    if (open.ready != nullptr) {
      if (ze_result_t r = ze.zeEventDestroy(open.ready); r != ZE_RESULT_SUCCESS) {
        spdlog::error("level_zero: destroy a ready event: {}", ZeLoader::ResultName(r));
      }
    }
    if (open.pool != nullptr) {
      if (ze_result_t r = ze.zeEventPoolCloseIpcHandle(open.pool); r != ZE_RESULT_SUCCESS) {
        spdlog::error("level_zero: close a ready-event pool: {}", ZeLoader::ResultName(r));
      }
    }
    if (open.base != nullptr) {
      if (ze_result_t r = ze.zeMemCloseIpcHandle(open.context, open.base); r != ZE_RESULT_SUCCESS) {
        spdlog::error("level_zero: close an IPC open: {}", ZeLoader::ResultName(r));
      }
    }
  }

  absl::Mutex mu_;
  std::map<Key, std::unique_ptr<Open>> opens_ ABSL_GUARDED_BY(mu_);
};

namespace {

class ZeRegion final : public ImportedRegion {
 public:
  ZeRegion(std::shared_ptr<ZeImporter::Opens> opens, ZeImporter::Opens::Key key, ZeImporter::Opens::Open* open,
           uint8_t* data, uint64_t size, MapMode mode, int32_t ordinal)
      : opens_(std::move(opens)), key_(key), open_(open), data_(data), size_(size), mode_(mode), ordinal_(ordinal) {}
  ~ZeRegion() override { opens_->Release(key_); }
  uint8_t* data() const override { return data_; }
  uint64_t size() const override { return size_; }
  MapMode mode() const override { return mode_; }
  int32_t device_ordinal() const override { return ordinal_; }
  const StreamOrder* stream_order() const override { return open_->order.get(); }

 private:
  const std::shared_ptr<ZeImporter::Opens> opens_;
  const ZeImporter::Opens::Key key_;
  ZeImporter::Opens::Open* const open_;  // alive while this region holds its reference
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
  TENSORD_ASSIGN_OR_RETURN(Opens::Key key, Opens::KeyOf(buffer.handle.fds[0].get(), what));
  TENSORD_ASSIGN_OR_RETURN(Opens::Open * open, opens_->Acquire(ze, key, **device, context, *handle, buffer, what));
  auto* data = static_cast<uint8_t*>(open->base) + handle->offset;
  return std::make_unique<ZeRegion>(opens_, key, open, data, buffer.size, mode, (*device)->ordinal);
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
