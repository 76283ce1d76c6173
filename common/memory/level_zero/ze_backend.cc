#include "common/memory/level_zero/ze_backend.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace tensord::common {
namespace {

absl::StatusOr<UniqueFd> DupFd(int fd, const std::string& what) {
  if (fd < 0) return absl::InternalError(absl::StrCat(what, ": the driver gave no fd"));
  UniqueFd dup(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!dup.valid()) return absl::ErrnoToStatus(errno, what);
  return dup;
}

std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> WithoutFd(const char (&data)[ZE_MAX_IPC_HANDLE_SIZE]) {
  std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> bytes{};
  std::memcpy(bytes.data(), data, bytes.size());
  SetIpcFd(bytes, 0);
  return bytes;
}

}  // namespace

// ---- ZeBuffer ----

ZeBuffer::ZeBuffer(Parts parts) : parts_(std::move(parts)) {}

ZeBuffer::~ZeBuffer() {
  const ZeLoader& ze = *parts_.loader;
  if (parts_.pool != nullptr) {
    if (ze_result_t r = ze.zeEventPoolDestroy(parts_.pool); r != ZE_RESULT_SUCCESS) {
      spdlog::error("level_zero: destroy the ready-event pool of {}: {}", parts_.debug_name, ZeLoader::ResultName(r));
    }
  }
  if (parts_.allocation != nullptr) {
    if (ze.zeMemPutIpcHandle != nullptr) (void)ze.zeMemPutIpcHandle(parts_.context, parts_.allocation_ipc);
    if (ze_result_t r = ze.zeMemFree(parts_.context, parts_.allocation); r != ZE_RESULT_SUCCESS) {
      spdlog::error("level_zero: free {} ({} bytes): {}", parts_.debug_name, parts_.size, ZeLoader::ResultName(r));
    }
  }
}

absl::StatusOr<MemoryHandle> ZeBuffer::Export() const {
  const std::string what = absl::StrCat("dup the fds of level_zero buffer ", parts_.debug_name);
  MemoryHandle out;
  out.data = EncodeZeHandle(parts_.handle);
  TENSORD_ASSIGN_OR_RETURN(UniqueFd memory, DupFd(parts_.memory_fd.get(), what));
  TENSORD_ASSIGN_OR_RETURN(UniqueFd pool, DupFd(parts_.pool_fd.get(), what));
  out.fds.push_back(std::move(memory));
  out.fds.push_back(std::move(pool));
  return out;
}

absl::Status ZeBuffer::CheckShareable(const std::string& what) const {
  (void)what;
  return absl::OkStatus();
}

// ---- ZeBackend ----

ZeBackend::ZeBackend() : ZeBackend(&ZeLoader::Get()) {}

ZeBackend::ZeBackend(const ZeLoader* loader) : loader_(loader) {
  if (!loader_->available()) {
    unavailable_reason_ = loader_->unavailable_reason();
    return;
  }
  std::vector<std::pair<ze_driver_handle_t, ze_context_handle_t>> by_driver;
  for (const ZeDevice& ze : loader_->devices()) {
    ze_context_handle_t context = nullptr;
    for (const auto& [driver, c] : by_driver) {
      if (driver == ze.driver) context = c;
    }
    if (context == nullptr) {
      ze_context_desc_t desc{};
      desc.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC;
      if (ze_result_t r = loader_->zeContextCreate(ze.driver, &desc, &context); r != ZE_RESULT_SUCCESS) {
        spdlog::warn("level_zero: {} left out: zeContextCreate: {}", ZeDeviceName(ze), ZeLoader::ResultName(r));
        continue;
      }
      by_driver.emplace_back(ze.driver, context);
      contexts_.push_back(context);
    }
    Device d;
    d.ze = &ze;
    d.context = context;
    d.info.device.set_type(tensord::v1::DEVICE_TYPE_ONEAPI);
    d.info.device.set_index(ze.ordinal);
    d.info.device.set_uuid(ze.uuid);
    d.info.name = ze.name;
    d.info.total_bytes = ze.total_bytes;
    devices_.push_back(std::move(d));
  }
  if (devices_.empty()) unavailable_reason_ = "no Level Zero device could get a context (zeContextCreate failed)";
}

ZeBackend::~ZeBackend() {
  // Buffers go first (the broker destroys them before its backends).
  for (ze_context_handle_t context : contexts_) (void)loader_->zeContextDestroy(context);
}

std::vector<BackendDevice> ZeBackend::devices() const {
  std::vector<BackendDevice> out;
  out.reserve(devices_.size());
  for (const Device& d : devices_) out.push_back(d.info);
  return out;
}

absl::StatusOr<const ZeBackend::Device*> ZeBackend::Find(const BackendDevice& device) const {
  if (!unavailable_reason_.empty()) return absl::UnavailableError(absl::StrCat("level_zero: ", unavailable_reason_));
  for (const Device& d : devices_) {
    if (d.info.device.index() != device.device.index()) continue;
    if (!device.device.uuid().empty() && device.device.uuid() != d.info.device.uuid()) {
      return absl::InvalidArgumentError(absl::StrCat("level_zero device ", device.device.index(), " is ",
                                                     FormatZeUuid(d.info.device.uuid()), ", not ",
                                                     FormatZeUuid(device.device.uuid())));
    }
    return &d;
  }
  return absl::InvalidArgumentError(absl::StrCat("level_zero device ", device.device.index(), " is not served here"));
}

uint64_t ZeBackend::RoundUp(const BackendDevice& device, uint64_t size) const {
  if (!Find(device).ok()) return std::numeric_limits<uint64_t>::max();
  constexpr uint64_t g = kZeAllocationGranularity;
  if (size > std::numeric_limits<uint64_t>::max() - (g - 1)) return std::numeric_limits<uint64_t>::max();
  return (size + g - 1) / g * g;
}

absl::Status ZeBackend::MakeReadyPool(const Device& device, ZeBuffer::Parts& parts, const std::string& where) const {
  ze_event_pool_desc_t desc{};
  desc.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC;
  // Host-visible: a consumer without a command list waits on the host.
  desc.flags = ZE_EVENT_POOL_FLAG_IPC | ZE_EVENT_POOL_FLAG_HOST_VISIBLE;
  desc.count = 1;
  ze_device_handle_t handle = device.ze->device;
  TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(loader_->zeEventPoolCreate(device.context, &desc, 1, &handle, &parts.pool),
                                             absl::StrCat("zeEventPoolCreate for ", where)));
  ze_ipc_event_pool_handle_t ipc{};
  TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(loader_->zeEventPoolGetIpcHandle(parts.pool, &ipc),
                                             absl::StrCat("zeEventPoolGetIpcHandle for ", where)));
  std::array<uint8_t, ZE_MAX_IPC_HANDLE_SIZE> bytes{};
  std::memcpy(bytes.data(), ipc.data, bytes.size());
  TENSORD_ASSIGN_OR_RETURN(parts.pool_fd, DupFd(IpcFd(bytes), absl::StrCat("the event pool fd for ", where)));
  parts.handle.has_event_pool = true;
  parts.handle.event_count = 1;
  parts.handle.event_pool = WithoutFd(ipc.data);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> ZeBackend::Allocate(const BackendDevice& device, uint64_t size,
                                                                   const std::string& debug_name) {
  TENSORD_ASSIGN_OR_RETURN(const Device* d, Find(device));
  const std::string where = absl::StrCat(size, " bytes on ", ZeDeviceName(*d->ze), " for ", debug_name);
  if (size == 0 || size % kZeAllocationGranularity != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate ", where, ": not a multiple of ", kZeAllocationGranularity));
  }
  ZeBuffer::Parts parts;
  parts.loader = loader_;
  parts.context = d->context;
  parts.size = size;
  parts.debug_name = debug_name;
  ze_device_mem_alloc_desc_t desc{};
  desc.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
  TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(
      loader_->zeMemAllocDevice(d->context, &desc, size, kZeAllocationGranularity, d->ze->device, &parts.allocation),
      absl::StrCat("zeMemAllocDevice of ", where)));
  // From here the buffer owns what it has: a failure below frees it in ~ZeBuffer.
  auto buffer_parts = [&]() -> absl::Status {
    TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(
        loader_->zeMemGetIpcHandle(d->context, parts.allocation, &parts.allocation_ipc),
        absl::StrCat("zeMemGetIpcHandle of ", where)));
    TENSORD_ASSIGN_OR_RETURN(parts.memory_fd, DupFd(loader_->MemoryFdOf(d->context, parts.allocation_ipc),
                                                    absl::StrCat("the memory fd of ", where)));
    parts.handle.kind = ZeHandleKind::kDaemonAllocation;
    parts.handle.uuid = d->ze->uuid;
    parts.handle.size = size;
    parts.handle.offset = 0;
    parts.handle.memory = WithoutFd(parts.allocation_ipc.data);
    return MakeReadyPool(*d, parts, where);
  };
  absl::Status made = buffer_parts();
  auto buffer = std::make_unique<ZeBuffer>(std::move(parts));
  if (!made.ok()) return made;
  return buffer;
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> ZeBackend::Adopt(const BackendDevice& device, MemoryHandle handle,
                                                                uint64_t size, const std::string& what) {
  TENSORD_ASSIGN_OR_RETURN(const Device* d, Find(device));
  if (handle.fds.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a level_zero export carries the allocation's fd, 1, not ", handle.fds.size()));
  }
  absl::StatusOr<ZeHandle> decoded = DecodeZeHandle(handle.data);
  if (!decoded.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", decoded.status().message()));
  if (decoded->kind != ZeHandleKind::kProducerExport || decoded->has_event_pool) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a ", ZeHandleKindName(decoded->kind),
                                                   " handle", decoded->has_event_pool ? " with an event pool" : "",
                                                   " is not what a producer exports"));
  }
  if (decoded->uuid != d->ze->uuid) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the handle is for ", FormatZeUuid(decoded->uuid),
                                                   ", not ", ZeDeviceName(*d->ze)));
  }
  if (size == 0 || size > decoded->size - decoded->offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", size, " bytes do not fit the allocation of ",
                                                   decoded->size, " bytes from offset ", decoded->offset));
  }
  ZeBuffer::Parts parts;
  parts.loader = loader_;
  parts.context = d->context;
  parts.memory_fd = std::move(handle.fds[0]);
  parts.handle = *std::move(decoded);
  parts.size = size;
  parts.debug_name = what;
  absl::Status made = MakeReadyPool(*d, parts, what);
  auto buffer = std::make_unique<ZeBuffer>(std::move(parts));
  if (!made.ok()) return made;
  return buffer;
}

}  // namespace tensord::common
