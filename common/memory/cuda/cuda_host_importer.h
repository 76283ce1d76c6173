// CudaHostImporter: pinned views of host memory (DEVICE_TYPE_CUDA_HOST, kDLCUDAHost), so
// that a host-to-device copy from them runs at full bus speed. It wraps the host import:
// the buffer's memfd is mapped as HostImporter maps it, then the whole mapping is
// registered with cuMemHostRegister, once per region (an arena's many small tensors share
// one registration). The region's destructor calls cuMemHostUnregister before the munmap.
//
// A pinned view is a SHARED READ-ONLY mapping (MapMode::kSharedReadOnly), registered with
// CU_MEMHOSTREGISTER_PORTABLE (every context of the process sees it as pinned) and
// CU_MEMHOSTREGISTER_READ_ONLY (cuda.h: required to register memory the CPU maps
// read-only). Copy-on-write is refused: pinning a MAP_PRIVATE mapping would make the driver
// write-fault, and so copy, every page of the buffer, and the pinned pages would then be
// this process's copies, not the buffer. The registration is made in the primary context
// of this process's cuda device 0 (PORTABLE makes the device immaterial); a view's DLDevice
// is {kDLCUDAHost, 0}.
//
// Errors (messages name `what`): INVALID_ARGUMENT for a buffer that is not host memory or
// a mode other than kSharedReadOnly; UNAVAILABLE when the cuda driver is (no libcuda, no
// device), saying why; UNIMPLEMENTED when the device cannot pin read-only host memory
// (CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED is 0); the driver's error of
// cuMemHostRegister otherwise (RESOURCE_EXHAUSTED when it cannot lock that much memory);
// what HostImporter answers for the memfd. Nothing is left mapped or registered on error.
//
// Not run on hardware: tested against tests/fake_cuda only. Thread-safe; a region's
// destructor takes only the driver's context lock and never throws (a failed unregister is
// logged, and the memory is still unmapped).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/memory/cuda/cuda_driver.h"
#include "common/memory/importer.h"

namespace tensord::common {

class CudaHostImporter final : public Importer {
 public:
  // `host` maps the host buffers (a HostImporter; given, so that this library needs none
  // of the host backend's code). `driver`: null for the process's (CudaDriver::Get(),
  // loaded on the first Import), or one that outlives every region (tests).
  explicit CudaHostImporter(std::unique_ptr<Importer> host, const CudaDriver* driver = nullptr)
      : driver_(driver), host_(std::move(host)) {}

  tensord::v1::DeviceType device_type() const override { return tensord::v1::DEVICE_TYPE_CUDA_HOST; }
  // `buffer` is a host buffer (DEVICE_TYPE_CPU) and `mode` kSharedReadOnly; the region's
  // view_device_type() is DEVICE_TYPE_CUDA_HOST and its device_ordinal() 0.
  absl::StatusOr<std::unique_ptr<ImportedRegion>> Import(const FetchedBuffer& buffer, MapMode mode,
                                                         const std::string& what) override;
  // UNAVAILABLE without a driver or a device (it loads the driver).
  absl::Status CheckUsable(const std::string& what) const override;
  tensord::v1::DeviceType viewed_memory_type() const override { return tensord::v1::DEVICE_TYPE_CPU; }

 private:
  const CudaDriver* const driver_;  // null: CudaDriver::Get() at the first Import
  const std::unique_ptr<Importer> host_;
};

}  // namespace tensord::common
