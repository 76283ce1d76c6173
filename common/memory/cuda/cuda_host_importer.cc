#include "common/memory/cuda/cuda_host_importer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace tensord::common {
namespace {

// The device whose primary context makes and drops the registrations: this process's
// first. PORTABLE makes the pages pinned for every context, whichever device did it.
constexpr int kRegisteringOrdinal = 0;

// A host mapping registered with cuMemHostRegister; unregistered, then unmapped.
class CudaHostRegion final : public ImportedRegion {
 public:
  CudaHostRegion(const CudaDriver* driver, CUdevice device, std::unique_ptr<ImportedRegion> host)
      : driver_(driver), device_(device), host_(std::move(host)) {}
  CudaHostRegion(const CudaHostRegion&) = delete;
  CudaHostRegion& operator=(const CudaHostRegion&) = delete;

  ~CudaHostRegion() override {
    // host_ (the mapping) goes after this body: the pages stay mapped until unpinned.
    auto context = ScopedCudaContext::Push(*driver_, device_);
    if (!context.ok()) {
      spdlog::error("cuda: unregister {} bytes of pinned host memory: {}", host_->size(),
                    context.status().ToString());
      return;
    }
    if (CUresult r = driver_->cuMemHostUnregister(host_->data()); r != CUDA_SUCCESS) {
      spdlog::error("cuda: unregister {} bytes of pinned host memory: {}", host_->size(), driver_->ErrorText(r));
    }
  }

  uint8_t* data() const override { return host_->data(); }
  uint64_t size() const override { return host_->size(); }
  MapMode mode() const override { return host_->mode(); }
  int32_t device_ordinal() const override { return 0; }  // kDLCUDAHost names no device
  tensord::v1::DeviceType view_device_type() const override { return tensord::v1::DEVICE_TYPE_CUDA_HOST; }

 private:
  const CudaDriver* const driver_;
  const CUdevice device_;
  const std::unique_ptr<ImportedRegion> host_;
};

}  // namespace

absl::Status CudaHostImporter::CheckUsable(const std::string& what) const {
  const CudaDriver& driver = driver_ != nullptr ? *driver_ : CudaDriver::Get();
  if (driver.available()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(what, ": a pinned view needs the cuda driver: ", driver.unavailable_reason()));
}

absl::StatusOr<std::unique_ptr<ImportedRegion>> CudaHostImporter::Import(const FetchedBuffer& buffer, MapMode mode,
                                                                         const std::string& what) {
  if (buffer.device_type != tensord::v1::DEVICE_TYPE_CPU) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a pinned view is of host memory, and this is ",
                                                   tensord::v1::DeviceType_Name(buffer.device_type),
                                                   " memory"));
  }
  if (mode != MapMode::kSharedReadOnly) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a pinned view is a shared read-only mapping; pinning a copy-on-write or writable "
              "mapping is refused (the driver would copy every page)"));
  }
  TENSORD_RETURN_IF_ERROR(CheckUsable(what));
  const CudaDriver& driver = driver_ != nullptr ? *driver_ : CudaDriver::Get();
  CUdevice device = 0;
  TENSORD_RETURN_IF_ERROR(driver.CudaStatus(driver.cuDeviceGet(&device, kRegisteringOrdinal),
                                            absl::StrCat(what, ": cuDeviceGet ", kRegisteringOrdinal)));

  TENSORD_ASSIGN_OR_RETURN(std::unique_ptr<ImportedRegion> host, host_->Import(buffer, mode, what));
  // On any error below `host` unmaps as it goes.
  TENSORD_ASSIGN_OR_RETURN(ScopedCudaContext context, ScopedCudaContext::Push(driver, device));
  const CUresult r = driver.cuMemHostRegister_v2(host->data(), host->size(),
                                                 CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_READ_ONLY);
  if (r == CUDA_ERROR_NOT_SUPPORTED) {
    return absl::UnimplementedError(absl::StrCat(
        what, ": cuda device ", device, " cannot pin read-only host memory (", driver.ErrorText(r),
        "; CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED is 0), and a pinned view is a read-only "
        "mapping: acquire it unpinned"));
  }
  TENSORD_RETURN_IF_ERROR(driver.CudaStatus(
      r, absl::StrCat(what, ": cuMemHostRegister of ", host->size(), " bytes on cuda device ", device)));
  return std::make_unique<CudaHostRegion>(&driver, device, std::move(host));
}

}  // namespace tensord::common
