#include "common/memory/cuda/cuda_backend.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace tensord::common {
namespace {

std::string DeviceName(int ordinal, const std::string& uuid) {
  return absl::StrCat("cuda:", ordinal, " (", FormatGpuUuid(uuid), ")");
}

}  // namespace

CUmemAllocationProp CudaAllocationProp(CUdevice device) {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// ---- CudaVmmBuffer ----

CudaVmmBuffer::CudaVmmBuffer(const CudaDriver* driver, CUmemGenericAllocationHandle handle, UniqueFd fd,
                             uint64_t size, std::string uuid, std::string debug_name)
    : driver_(driver),
      handle_(handle),
      fd_(std::move(fd)),
      size_(size),
      uuid_(std::move(uuid)),
      debug_name_(std::move(debug_name)) {}

CudaVmmBuffer::~CudaVmmBuffer() {
  // fd_ closes after this body; order does not matter: each is one reference.
  if (CUresult r = driver_->cuMemRelease(handle_); r != CUDA_SUCCESS) {
    spdlog::error("cuda: release allocation {} ({} bytes on {}): {}", debug_name_, size_, FormatGpuUuid(uuid_),
                  driver_->ErrorText(r));
  }
}

absl::StatusOr<MemoryHandle> CudaVmmBuffer::Export() const {
  UniqueFd dup(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (!dup.valid()) {
    return absl::ErrnoToStatus(errno, absl::StrCat("dup the fd of cuda buffer ", debug_name_));
  }
  CudaHandle handle;
  handle.kind = CudaHandleKind::kVmmFd;
  handle.uuid = uuid_;
  handle.size = size_;
  MemoryHandle out;
  out.data = EncodeCudaHandle(handle);
  out.fds.push_back(std::move(dup));
  return out;
}

absl::Status CudaVmmBuffer::CheckShareable(const std::string& what) const {
  // Readers get their own mapping, read-only where the driver allows (cuda_importer.h);
  // nothing the producer can do to the allocation makes a reader's mapping fault.
  (void)what;
  return absl::OkStatus();
}

// ---- CudaIpcBuffer ----

absl::StatusOr<MemoryHandle> CudaIpcBuffer::Export() const {
  MemoryHandle out;
  out.data = handle_bytes_;
  return out;
}

absl::Status CudaIpcBuffer::CheckShareable(const std::string& what) const {
  (void)what;
  return absl::OkStatus();
}

// ---- CudaBackend ----

CudaBackend::CudaBackend() : CudaBackend(&CudaDriver::Get()) {}

CudaBackend::CudaBackend(const CudaDriver* driver) : driver_(driver) { Enumerate(); }

void CudaBackend::Enumerate() {
  if (!driver_->available()) {
    unavailable_reason_ = driver_->unavailable_reason();
    return;
  }
  int count = 0;
  if (CUresult r = driver_->cuDeviceGetCount(&count); r != CUDA_SUCCESS) {
    unavailable_reason_ = driver_->CudaStatus(r, "cuDeviceGetCount").ToString();
    return;
  }
  if (count <= 0) {
    unavailable_reason_ = "no CUDA device";
    return;
  }
  std::vector<std::string> skipped;
  for (int ordinal = 0; ordinal < count && ordinal < kMaxCudaDevices; ++ordinal) {
    // Each query's failure leaves this one device out, with the reason.
    auto skip = [&](absl::Status why) { skipped.push_back(absl::StrCat("cuda:", ordinal, ": ", why.message())); };
    CUdevice device = 0;
    if (CUresult r = driver_->cuDeviceGet(&device, ordinal); r != CUDA_SUCCESS) {
      skip(driver_->CudaStatus(r, "cuDeviceGet"));
      continue;
    }
    auto uuid = driver_->DeviceUuid(device);
    if (!uuid.ok()) {
      skip(uuid.status());
      continue;
    }
    int vmm = 0;
    int posix_fd = 0;
    if (driver_->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) !=
            CUDA_SUCCESS ||
        driver_->cuDeviceGetAttribute(&posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                      device) != CUDA_SUCCESS ||
        vmm == 0 || posix_fd == 0) {
      skip(absl::FailedPreconditionError("no VMM allocations exportable as POSIX fds"));
      continue;
    }
    CUmemAllocationProp prop = CudaAllocationProp(device);
    size_t granularity = 0;
    if (CUresult r = driver_->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        r != CUDA_SUCCESS || granularity == 0 || (granularity & (granularity - 1)) != 0) {
      skip(driver_->CudaStatus(r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : r, "cuMemGetAllocationGranularity"));
      continue;
    }
    char name[256] = {};
    if (driver_->cuDeviceGetName(name, sizeof(name) - 1, device) != CUDA_SUCCESS) name[0] = '\0';
    size_t total = 0;
    if (driver_->cuDeviceTotalMem_v2(&total, device) != CUDA_SUCCESS) total = 0;

    Device d;
    d.device = device;
    d.granularity = granularity;
    d.info.device.set_type(tensord::v1::DEVICE_TYPE_CUDA);
    d.info.device.set_index(ordinal);
    d.info.device.set_uuid(*uuid);
    d.info.name = name;
    d.info.total_bytes = total;
    devices_.push_back(std::move(d));
  }
  for (const std::string& why : skipped) spdlog::warn("cuda: device left out: {}", why);
  if (devices_.empty()) {
    unavailable_reason_ = absl::StrCat("no usable CUDA device (", skipped.empty() ? "none" : skipped.front(), ")");
  }
}

std::vector<BackendDevice> CudaBackend::devices() const {
  std::vector<BackendDevice> out;
  out.reserve(devices_.size());
  for (const Device& d : devices_) out.push_back(d.info);
  return out;
}

absl::StatusOr<const CudaBackend::Device*> CudaBackend::Find(const BackendDevice& device) const {
  if (!unavailable_reason_.empty()) return absl::UnavailableError(absl::StrCat("cuda: ", unavailable_reason_));
  for (const Device& d : devices_) {
    if (d.info.device.index() != device.device.index()) continue;
    if (!device.device.uuid().empty() && device.device.uuid() != d.info.device.uuid()) {
      return absl::InvalidArgumentError(absl::StrCat("cuda device ", device.device.index(), " is ",
                                                     FormatGpuUuid(d.info.device.uuid()), ", not ",
                                                     FormatGpuUuid(device.device.uuid())));
    }
    return &d;
  }
  return absl::InvalidArgumentError(absl::StrCat("cuda device ", device.device.index(), " is not served here"));
}

uint64_t CudaBackend::RoundUp(const BackendDevice& device, uint64_t size) const {
  auto d = Find(device);
  if (!d.ok()) return std::numeric_limits<uint64_t>::max();
  const uint64_t g = (*d)->granularity;
  if (size > std::numeric_limits<uint64_t>::max() - (g - 1)) return std::numeric_limits<uint64_t>::max();
  return (size + g - 1) / g * g;
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> CudaBackend::Allocate(const BackendDevice& device, uint64_t size,
                                                                     const std::string& debug_name) {
  auto found = Find(device);
  if (!found.ok()) return found.status();
  const Device& d = **found;
  const std::string where = absl::StrCat(size, " bytes on ", DeviceName(d.info.device.index(), d.info.device.uuid()),
                                         " for ", debug_name);
  if (size == 0 || size % d.granularity != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate ", where, ": not a multiple of the granularity ", d.granularity));
  }
  CUmemAllocationProp prop = CudaAllocationProp(d.device);
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = driver_->cuMemCreate(&handle, size, &prop, 0); r != CUDA_SUCCESS) {
    return driver_->CudaStatus(r, absl::StrCat("cuMemCreate of ", where));
  }
  int fd = -1;
  CUresult r = driver_->cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS || fd < 0) {
    absl::Status status = driver_->CudaStatus(r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_HANDLE : r,
                                              absl::StrCat("export ", where, " as a POSIX fd"));
    if (CUresult rr = driver_->cuMemRelease(handle); rr != CUDA_SUCCESS) {
      spdlog::error("cuda: release unexported allocation of {}: {}", where, driver_->ErrorText(rr));
    }
    return status;
  }
  return std::make_unique<CudaVmmBuffer>(driver_, handle, UniqueFd(fd), size, d.info.device.uuid(), debug_name);
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> CudaBackend::Adopt(const BackendDevice& device, MemoryHandle handle,
                                                                  uint64_t size, const std::string& what) {
  auto found = Find(device);
  if (!found.ok()) return found.status();
  const Device& d = **found;
  if (!handle.fds.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a cuda IPC handle carries no fd, got ", handle.fds.size()));
  }
  auto decoded = DecodeCudaHandle(handle.data);
  if (!decoded.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", decoded.status().message()));
  if (decoded->kind != CudaHandleKind::kLegacyIpc) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": adopting a ", CudaHandleKindName(decoded->kind), " handle is not supported"));
  }
  if (decoded->uuid != d.info.device.uuid()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the handle is for ", FormatGpuUuid(decoded->uuid),
                                                   ", not ", DeviceName(d.info.device.index(),
                                                                        d.info.device.uuid())));
  }
  if (size == 0 || size > decoded->size - decoded->offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", size, " bytes do not fit the allocation of ",
                                                   decoded->size, " bytes from offset ", decoded->offset));
  }
  return std::make_unique<CudaIpcBuffer>(std::move(handle.data), size);
}

}  // namespace tensord::common
