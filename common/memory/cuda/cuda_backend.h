// CudaBackend: the server half of the cuda memory kind (DEVICE_TYPE_CUDA). Broker-owned
// buffers are VMM allocations (cuMemCreate, pinned, on one device, exportable as a POSIX
// fd); producer exports are adopted as legacy CUDA IPC handles.
//
// Devices: every device the daemon sees, named by UUID (Device.uuid, 16 raw bytes) with
// the daemon's ordinal in Device.index; a device without VMM or POSIX-fd export support is
// left out (logged once). Enumerated once, at construction: CUDA fixes its device list at
// cuInit.
//
// No context. cuMemCreate, cuMemExportToShareableHandle, cuMemRelease and
// cuMemGetAllocationGranularity name their device in a CUmemLocation and are not documented
// to need a current context (cuda_driver.h), so the daemon never creates or retains one:
// a context costs hundreds of MiB of device memory per GPU and the daemon touches no data.
// What the daemon holds per GPU is one allocation handle and one fd per buffer.
//
// Granularity: RoundUp uses cuMemGetAllocationGranularity(MINIMUM) for a pinned allocation
// on that device with the POSIX-fd handle type (2 MiB on current GPUs): the size cuMemCreate
// and cuMemMap require. Quotas count the rounded size.
//
// Handles (cuda_handle.h): Allocate's buffer exports a VMM handle (32 bytes) and a dup of
// its fd; an adopted buffer hands back the producer's legacy IPC bytes, unchanged, with no
// fd. Legacy IPC memory belongs to the producer: the broker cannot keep it alive, so the
// producer's death must retire the tensor (the broker's policy, not this class's).
//
// Errors: INVALID_ARGUMENT for a device this backend does not serve or a size that is not
// rounded up; RESOURCE_EXHAUSTED when the device is out of memory; UNAVAILABLE when the
// driver is; other driver failures by CudaDriver::CudaStatus. Messages name the device
// (cuda:N, GPU-uuid), the debug name and the driver's error.
//
// Thread-safe: immutable after construction; the driver is thread-safe.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/memory/cuda/cuda_driver.h"
#include "common/memory/cuda/cuda_handle.h"
#include "common/memory/memory_backend.h"
#include "common/unique_fd.h"

namespace tensord::common {

// One VMM allocation the daemon owns: the allocation handle and the fd it was exported as
// once. The destructor closes the fd and cuMemRelease-s the handle (the memory is freed
// when every importer has unmapped and released it too); a failure is logged, never thrown.
class CudaVmmBuffer final : public BackendBuffer {
 public:
  CudaVmmBuffer(const CudaDriver* driver, CUmemGenericAllocationHandle handle, UniqueFd fd, uint64_t size,
                std::string uuid, std::string debug_name);
  CudaVmmBuffer(const CudaVmmBuffer&) = delete;
  CudaVmmBuffer& operator=(const CudaVmmBuffer&) = delete;
  ~CudaVmmBuffer() override;

  uint64_t size() const override { return size_; }
  // A 32-byte VMM handle and one dup (O_CLOEXEC) of the fd. RESOURCE_EXHAUSTED when the
  // process is out of fds.
  absl::StatusOr<MemoryHandle> Export() const override;
  absl::Status CheckShareable(const std::string& what) const override;
  // The broker pools it for its producer's next tensor of about the same size: exported
  // once, imported once by each process that keeps its mapping (the producer's writable
  // one, readers' lingering ones), so a recycled handoff makes no driver call on any side.
  bool Recyclable() const override { return true; }

 private:
  const CudaDriver* const driver_;
  const CUmemGenericAllocationHandle handle_;
  const UniqueFd fd_;
  const uint64_t size_;
  const std::string uuid_;
  const std::string debug_name_;
};

// A producer's legacy IPC handle, kept as the bytes it came in; owns no device resource.
// The memory lives only as long as the producer's process keeps it: OwnedByProducer().
class CudaIpcBuffer final : public BackendBuffer {
 public:
  CudaIpcBuffer(std::string handle_bytes, uint64_t size)
      : handle_bytes_(std::move(handle_bytes)), size_(size) {}
  uint64_t size() const override { return size_; }
  absl::StatusOr<MemoryHandle> Export() const override;
  absl::Status CheckShareable(const std::string& what) const override;
  bool OwnedByProducer() const override { return true; }

 private:
  const std::string handle_bytes_;
  const uint64_t size_;
};

class CudaBackend final : public MemoryBackend {
 public:
  // Loads the process's driver (CudaDriver::Get(); the first call may take a while) and
  // enumerates its devices. Never fails: an unavailable driver makes an unavailable backend.
  CudaBackend();
  // For tests: a driver the caller keeps alive longer than the backend.
  explicit CudaBackend(const CudaDriver* driver);

  std::string_view name() const override { return "cuda"; }
  tensord::v1::DeviceType device_type() const override { return tensord::v1::DEVICE_TYPE_CUDA; }
  // The driver's reason, "no CUDA device" when it sees none, or why no device can serve.
  std::string unavailable_reason() const override { return unavailable_reason_; }
  std::vector<BackendDevice> devices() const override;
  // `size` rounded up to the device's granularity; 0 stays 0; UINT64_MAX when rounding
  // overflows or the device is unknown (so the quota refuses it).
  uint64_t RoundUp(const BackendDevice& device, uint64_t size) const override;
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Allocate(const BackendDevice& device, uint64_t size,
                                                          const std::string& debug_name) override;
  // `handle.data`: a legacy IPC CudaHandle on `device` whose allocation holds `size` bytes
  // from its offset; `handle.fds` must be empty. INVALID_ARGUMENT naming `what` otherwise;
  // UNIMPLEMENTED for a VMM fd handle (producers' VMM memory is not adopted yet).
  absl::StatusOr<std::unique_ptr<BackendBuffer>> Adopt(const BackendDevice& device, MemoryHandle handle,
                                                       uint64_t size, const std::string& what) override;

 private:
  struct Device {
    BackendDevice info;
    CUdevice device = 0;
    uint64_t granularity = 0;
  };
  void Enumerate();
  // The device `device` names (by index, checked against its uuid when one is given).
  absl::StatusOr<const Device*> Find(const BackendDevice& device) const;

  const CudaDriver* const driver_;
  std::string unavailable_reason_;
  std::vector<Device> devices_;
};

// The allocation properties tensord uses on `device`: pinned, that device, POSIX-fd export.
CUmemAllocationProp CudaAllocationProp(CUdevice device);

}  // namespace tensord::common
