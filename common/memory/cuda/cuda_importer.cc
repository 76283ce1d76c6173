#include "common/memory/cuda/cuda_importer.h"

#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/memory/cuda/cuda_backend.h"
#include "common/status.h"
#include "common/memory/cuda/cuda_handle.h"
#include "common/memory/cuda/cuda_stream_order.h"
#include "spdlog/spdlog.h"

namespace tensord::common {

// Legacy IPC opens of this process, by (uuid, IPC handle bytes), refcounted.
class CudaImporter::IpcOpens {
 public:
  // The device pointer of the allocation `key` names, opened on `device` if not yet open.
  absl::StatusOr<CUdeviceptr> Acquire(const CudaDriver& driver, const std::string& key, CUdevice device,
                                      const CUipcMemHandle& handle, const std::string& what) {
    absl::MutexLock lock(&mu_);
    auto it = opens_.find(key);
    if (it != opens_.end()) {
      ++it->second.refs;
      return it->second.base;
    }
    auto context = ScopedCudaContext::Push(driver, device);
    if (!context.ok()) return context.status();
    CUdeviceptr base = 0;
    if (CUresult r = driver.cuIpcOpenMemHandle_v2(&base, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        r != CUDA_SUCCESS) {
      return driver.CudaStatus(r, absl::StrCat(what, ": cuIpcOpenMemHandle on cuda device ", device));
    }
    opens_.emplace(key, Open{&driver, base, device, 1});
    return base;
  }

  // Drops one reference; the last closes the open. Under the lock, so a concurrent
  // Acquire of the same allocation never sees it half-closed.
  void Release(const std::string& key) {
    absl::MutexLock lock(&mu_);
    auto it = opens_.find(key);
    if (it == opens_.end() || --it->second.refs > 0) return;
    const Open open = it->second;
    opens_.erase(it);
    auto context = ScopedCudaContext::Push(*open.driver, open.device);
    if (!context.ok()) {
      spdlog::error("cuda: close an IPC open on cuda device {}: {}", open.device, context.status().ToString());
      return;
    }
    if (CUresult r = open.driver->cuIpcCloseMemHandle(open.base); r != CUDA_SUCCESS) {
      spdlog::error("cuda: close an IPC open on cuda device {}: {}", open.device, open.driver->ErrorText(r));
    }
  }

 private:
  struct Open {
    const CudaDriver* driver = nullptr;
    CUdeviceptr base = 0;
    CUdevice device = 0;
    int refs = 0;
  };
  absl::Mutex mu_;
  std::map<std::string, Open> opens_ ABSL_GUARDED_BY(mu_);
};

namespace {

std::once_flag g_read_only_refused_logged;

// A VMM allocation imported, reserved, mapped and made accessible; undone in reverse.
class CudaVmmRegion final : public CudaRegion {
 public:
  CudaVmmRegion(const CudaDriver* driver, CUdevice device, CUmemGenericAllocationHandle handle, CUdeviceptr ptr,
                uint64_t mapped, uint64_t size, MapMode mode, bool enforced)
      : driver_(driver),
        device_(device),
        handle_(handle),
        ptr_(ptr),
        mapped_(mapped),
        size_(size),
        mode_(mode),
        enforced_(enforced) {}
  CudaVmmRegion(const CudaVmmRegion&) = delete;
  CudaVmmRegion& operator=(const CudaVmmRegion&) = delete;

  ~CudaVmmRegion() override {
    if (CUresult r = driver_->cuMemUnmap(ptr_, mapped_); r != CUDA_SUCCESS) {
      // The range is still mapped: freeing the reservation under it would be worse than
      // leaking both.
      spdlog::error("cuda: unmap {} bytes on cuda device {}: {}", mapped_, device_, driver_->ErrorText(r));
      return;
    }
    if (CUresult r = driver_->cuMemRelease(handle_); r != CUDA_SUCCESS) {
      spdlog::error("cuda: release an imported allocation on cuda device {}: {}", device_, driver_->ErrorText(r));
    }
    if (CUresult r = driver_->cuMemAddressFree(ptr_, mapped_); r != CUDA_SUCCESS) {
      spdlog::error("cuda: free {} bytes of address space: {}", mapped_, driver_->ErrorText(r));
    }
  }

  uint8_t* data() const override { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(ptr_)); }
  uint64_t size() const override { return size_; }
  MapMode mode() const override { return mode_; }
  int device_ordinal() const override { return static_cast<int>(device_); }
  const StreamOrder* stream_order() const override { return &CudaStreamOrder::For(*driver_); }
  bool access_enforced() const override { return enforced_; }

 private:
  const CudaDriver* const driver_;
  const CUdevice device_;
  const CUmemGenericAllocationHandle handle_;
  const CUdeviceptr ptr_;
  const uint64_t mapped_;  // the whole allocation
  const uint64_t size_;    // what the broker says the buffer holds
  const MapMode mode_;
  const bool enforced_;
};

class CudaIpcRegion final : public CudaRegion {
 public:
  CudaIpcRegion(const CudaDriver* driver, std::shared_ptr<CudaImporter::IpcOpens> opens, std::string key,
                CUdevice device, CUdeviceptr data, uint64_t size, MapMode mode)
      : driver_(driver),
        opens_(std::move(opens)),
        key_(std::move(key)),
        device_(device),
        data_(data),
        size_(size),
        mode_(mode) {}
  CudaIpcRegion(const CudaIpcRegion&) = delete;
  CudaIpcRegion& operator=(const CudaIpcRegion&) = delete;
  ~CudaIpcRegion() override { opens_->Release(key_); }

  uint8_t* data() const override { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(data_)); }
  uint64_t size() const override { return size_; }
  MapMode mode() const override { return mode_; }
  int device_ordinal() const override { return static_cast<int>(device_); }
  const StreamOrder* stream_order() const override { return &CudaStreamOrder::For(*driver_); }
  bool access_enforced() const override { return mode_ != MapMode::kSharedReadOnly; }

 private:
  const CudaDriver* const driver_;
  const std::shared_ptr<CudaImporter::IpcOpens> opens_;
  const std::string key_;
  const CUdevice device_;
  const CUdeviceptr data_;
  const uint64_t size_;
  const MapMode mode_;
};

absl::StatusOr<std::unique_ptr<ImportedRegion>> ImportVmm(const CudaDriver& driver, const CudaHandle& handle,
                                                          CUdevice device, const FetchedBuffer& buffer,
                                                          MapMode mode, const std::string& what) {
  if (buffer.handle.fds.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a VMM handle comes with one fd, got ", buffer.handle.fds.size()));
  }
  CUmemAllocationProp prop = CudaAllocationProp(device);
  size_t granularity = 0;
  if (CUresult r = driver.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS) {
    return driver.CudaStatus(r, absl::StrCat(what, ": cuMemGetAllocationGranularity on cuda device ", device));
  }
  if (granularity == 0 || handle.size % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": allocation of ", handle.size,
                                                   " bytes is not a multiple of the granularity ", granularity));
  }
  const size_t size = handle.size;

  CUmemGenericAllocationHandle imported = 0;
  void* os_handle = reinterpret_cast<void*>(static_cast<uintptr_t>(buffer.handle.fds[0].get()));
  if (CUresult r = driver.cuMemImportFromShareableHandle(&imported, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS) {
    return driver.CudaStatus(r, absl::StrCat(what, ": cuMemImportFromShareableHandle"));
  }
  absl::Cleanup release = [&] {
    if (CUresult r = driver.cuMemRelease(imported); r != CUDA_SUCCESS) {
      spdlog::error("cuda: {}: release the imported allocation: {}", what, driver.ErrorText(r));
    }
  };
  CUdeviceptr ptr = 0;
  if (CUresult r = driver.cuMemAddressReserve(&ptr, size, granularity, 0, 0); r != CUDA_SUCCESS) {
    return driver.CudaStatus(r, absl::StrCat(what, ": reserve ", size, " bytes of address space"));
  }
  absl::Cleanup free_address = [&] {
    if (CUresult r = driver.cuMemAddressFree(ptr, size); r != CUDA_SUCCESS) {
      spdlog::error("cuda: {}: free the address reservation: {}", what, driver.ErrorText(r));
    }
  };
  if (CUresult r = driver.cuMemMap(ptr, size, 0, imported, 0); r != CUDA_SUCCESS) {
    return driver.CudaStatus(r, absl::StrCat(what, ": cuMemMap of ", size, " bytes"));
  }
  absl::Cleanup unmap = [&] {
    if (CUresult r = driver.cuMemUnmap(ptr, size); r != CUDA_SUCCESS) {
      spdlog::error("cuda: {}: unmap: {}", what, driver.ErrorText(r));
    }
  };

  CUmemAccessDesc access;
  std::memset(&access, 0, sizeof(access));
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = mode == MapMode::kSharedReadOnly ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  bool enforced = true;
  CUresult r = driver.cuMemSetAccess(ptr, size, &access, 1);
  if (r != CUDA_SUCCESS && mode == MapMode::kSharedReadOnly) {
    // The driver may not map device memory read-only; if read-write works, the refusal was
    // about read-only access, and the mapping stays usable.
    const CUresult read_only_refusal = r;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = driver.cuMemSetAccess(ptr, size, &access, 1);
    if (r == CUDA_SUCCESS) {
      enforced = false;
      std::call_once(g_read_only_refused_logged, [&] {
        spdlog::warn("cuda: the driver refused read-only access ({}); read-only cuda tensors are mapped writable",
                     driver.ErrorText(read_only_refusal));
      });
    }
  }
  if (r != CUDA_SUCCESS) {
    return driver.CudaStatus(r, absl::StrCat(what, ": cuMemSetAccess for cuda device ", device));
  }

  std::move(unmap).Cancel();
  std::move(free_address).Cancel();
  std::move(release).Cancel();
  return std::make_unique<CudaVmmRegion>(&driver, device, imported, ptr, size, buffer.size, mode, enforced);
}

}  // namespace

CudaImporter::CudaImporter() : CudaImporter(nullptr) {}

CudaImporter::CudaImporter(const CudaDriver* driver)
    : driver_(driver), ipc_opens_(std::make_shared<IpcOpens>()) {}

CudaImporter::~CudaImporter() = default;

absl::Status CudaImporter::NameDevice(tensord::v1::Device& device) const {
  const CudaDriver& driver = driver_ != nullptr ? *driver_ : CudaDriver::Get();
  if (!driver.available()) return absl::UnavailableError(absl::StrCat("cuda: ", driver.unavailable_reason()));
  int count = 0;
  TENSORD_RETURN_IF_ERROR(driver.CudaStatus(driver.cuDeviceGetCount(&count), "cuDeviceGetCount"));
  if (device.index() < 0 || device.index() >= count) {
    return absl::FailedPreconditionError(absl::StrCat("no cuda device ", device.index(), " in this process: it sees ",
                                                      count, " (CUDA_VISIBLE_DEVICES decides which)"));
  }
  CUdevice handle = 0;
  TENSORD_RETURN_IF_ERROR(driver.CudaStatus(driver.cuDeviceGet(&handle, device.index()), "cuDeviceGet"));
  TENSORD_ASSIGN_OR_RETURN(std::string uuid, driver.DeviceUuid(handle));
  device.set_uuid(std::move(uuid));
  return absl::OkStatus();
}

absl::StatusOr<MemoryHandle> CudaImporter::ExportExisting(const void* ptr, uint64_t bytes,
                                                          const tensord::v1::Device& device,
                                                          const std::string& what) const {
  const CudaDriver& driver = driver_ != nullptr ? *driver_ : CudaDriver::Get();
  if (!driver.available()) {
    return absl::UnavailableError(absl::StrCat(what, ": cuda: ", driver.unavailable_reason()));
  }
  if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": the device pointer is null"));
  if (bytes == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": no bytes to export"));
  const auto dptr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr));
  int ordinal = -1;
  if (CUresult r = driver.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr);
      r != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the pointer is not CUDA device memory this process knows (cuPointerGetAttribute: ",
        driver.ErrorText(r), ")"));
  }
  if (ordinal != device.index()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the pointer is on cuda:", ordinal,
                                                   ", the tensor's device is cuda:", device.index()));
  }
  CUdevice cu_device = 0;
  TENSORD_RETURN_IF_ERROR(driver.CudaStatus(driver.cuDeviceGet(&cu_device, ordinal),
                                            absl::StrCat(what, ": cuDeviceGet ", ordinal)));
  TENSORD_ASSIGN_OR_RETURN(std::string uuid, driver.DeviceUuid(cu_device));
  if (!device.uuid().empty() && device.uuid() != uuid) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cuda:", ordinal, " is ", FormatGpuUuid(uuid),
                                                   ", not ", FormatGpuUuid(device.uuid())));
  }
  // The allocation and its IPC handle are asked for in the context the memory is mapped in
  // on this device: the primary one, which the CUDA runtime (and torch) allocate in.
  TENSORD_ASSIGN_OR_RETURN(ScopedCudaContext context, ScopedCudaContext::Push(driver, cu_device));
  CUdeviceptr base = 0;
  size_t allocation = 0;
  TENSORD_RETURN_IF_ERROR(driver.CudaStatus(driver.cuMemGetAddressRange_v2(&base, &allocation, dptr),
                                            absl::StrCat(what, ": cuMemGetAddressRange on cuda:", ordinal)));
  const uint64_t offset = dptr - base;
  if (dptr < base || offset >= allocation || bytes > allocation - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", bytes,
                                                   " bytes from the pointer reach past its allocation of ",
                                                   allocation, " bytes (the pointer is at offset ", offset, ")"));
  }
  CUipcMemHandle ipc;
  if (CUresult r = driver.cuIpcGetMemHandle(&ipc, base); r != CUDA_SUCCESS) {
    return driver.CudaStatus(
        r, absl::StrCat(what, ": cuIpcGetMemHandle of the allocation on cuda:", ordinal,
                        " (legacy IPC shares memory from cuMemAlloc/cudaMalloc, not VMM or pool allocations)"));
  }
  CudaHandle handle;
  handle.kind = CudaHandleKind::kLegacyIpc;
  handle.uuid = std::move(uuid);
  handle.size = allocation;
  handle.offset = offset;
  static_assert(sizeof(ipc.reserved) == kCudaIpcHandleBytes);
  std::memcpy(handle.ipc_handle.data(), ipc.reserved, kCudaIpcHandleBytes);
  MemoryHandle out;
  out.data = EncodeCudaHandle(handle);
  return out;
}

absl::StatusOr<std::unique_ptr<ImportedRegion>> CudaImporter::Import(const FetchedBuffer& buffer, MapMode mode,
                                                                     const std::string& what) {
  const CudaDriver& driver = driver_ != nullptr ? *driver_ : CudaDriver::Get();
  if (!driver.available()) {
    return absl::UnavailableError(absl::StrCat(what, ": cuda: ", driver.unavailable_reason()));
  }
  if (buffer.device_type != tensord::v1::DEVICE_TYPE_CUDA) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a cuda buffer (device type ",
                                                   static_cast<int>(buffer.device_type), ")"));
  }
  auto handle = DecodeCudaHandle(buffer.handle.data);
  if (!handle.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", handle.status().message()));
  const uint64_t backed = handle->size - handle->offset;
  if (buffer.size == 0 || buffer.size > backed) {
    return absl::DataLossError(absl::StrCat(what, ": the cuda handle backs ", backed, " bytes, the buffer has ",
                                            buffer.size));
  }
  auto device = driver.DeviceByUuid(handle->uuid);
  if (!device.ok()) return absl::Status(device.status().code(), absl::StrCat(what, ": ", device.status().message()));

  if (handle->kind == CudaHandleKind::kVmmFd) return ImportVmm(driver, *handle, *device, buffer, mode, what);

  if (!buffer.handle.fds.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a legacy IPC handle comes with no fd, got ", buffer.handle.fds.size()));
  }
  CUipcMemHandle ipc;
  static_assert(sizeof(ipc.reserved) == kCudaIpcHandleBytes);
  std::memcpy(ipc.reserved, handle->ipc_handle.data(), kCudaIpcHandleBytes);
  std::string key = handle->uuid;
  key.append(reinterpret_cast<const char*>(handle->ipc_handle.data()), kCudaIpcHandleBytes);
  auto base = ipc_opens_->Acquire(driver, key, *device, ipc, what);
  if (!base.ok()) return base.status();
  return std::make_unique<CudaIpcRegion>(&driver, ipc_opens_, std::move(key), *device, *base + handle->offset,
                                         buffer.size, mode);
}

const StreamOrder* CudaImporter::stream_order() const {
  return &CudaStreamOrder::For(driver_ != nullptr ? *driver_ : CudaDriver::Get());
}

}  // namespace tensord::common
