#include "common/memory/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/memory/driver_library.h"
#include "spdlog/spdlog.h"

namespace tensord::common {
namespace {

constexpr const char kDefaultLibrary[] = "libcuda.so.1";

absl::StatusCode CodeFor(CUresult result) {
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
      return absl::StatusCode::kInvalidArgument;
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_ALREADY_MAPPED:
      return absl::StatusCode::kFailedPrecondition;
    case CUDA_ERROR_NOT_PERMITTED:
      return absl::StatusCode::kPermissionDenied;
    case CUDA_ERROR_NOT_SUPPORTED:
      return absl::StatusCode::kUnimplemented;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

std::string VisibleDevicesText() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible == nullptr ? "CUDA_VISIBLE_DEVICES unset" : absl::StrCat("CUDA_VISIBLE_DEVICES=", visible);
}

}  // namespace

const CudaDriver& CudaDriver::Get() {
  // Leaked on purpose: regions may be closed from static destructors and DLPack deleters
  // that run during exit, after a function-local static would be gone.
  static const CudaDriver* const driver = [] {
    auto* d = new CudaDriver();
    d->Load();
    if (!d->available()) spdlog::info("cuda: driver unavailable: {}", d->unavailable_reason());
    return d;
  }();
  return *driver;
}

void CudaDriver::Load() {
  library_ = DriverLibraryPath("TENSORD_LIBCUDA", kDefaultLibrary);
  dl_handle_ = OpenDriverLibrary(library_, "no NVIDIA driver on this machine", &unavailable_reason_);
  if (dl_handle_ == nullptr) return;

  // Resolve everything before calling anything, so a partial table is never used.
  bool complete = true;
#define TENSORD_CUDA_DRIVER_RESOLVE(name)                                                                   \
  if (complete) {                                                                                           \
    void* symbol =                                                                                          \
        DriverSymbol(dl_handle_, library_, #name, "the NVIDIA driver is too old or not CUDA's", &unavailable_reason_); \
    complete = symbol != nullptr;                                                                           \
    if (complete) name = reinterpret_cast<decltype(name)>(symbol);                                          \
  }
  TENSORD_CUDA_DRIVER_ENTRY_POINTS(TENSORD_CUDA_DRIVER_RESOLVE)
#undef TENSORD_CUDA_DRIVER_RESOLVE

  if (complete) {
    CUresult result = cuInit(0);
    if (result != CUDA_SUCCESS) {
      unavailable_reason_ = absl::StrCat(result == CUDA_ERROR_NO_DEVICE ? "no CUDA device: " : "",
                                         "cuInit: ", ErrorText(result), " (", VisibleDevicesText(), ")");
      complete = false;
    }
  }
  if (!complete) {
    // Unavailable means every entry point is null: no caller can reach a half-loaded driver.
#define TENSORD_CUDA_DRIVER_CLEAR(name) name = nullptr;
    TENSORD_CUDA_DRIVER_ENTRY_POINTS(TENSORD_CUDA_DRIVER_CLEAR)
#undef TENSORD_CUDA_DRIVER_CLEAR
  }
}

std::string CudaDriver::ErrorText(CUresult result) const {
  const char* name = nullptr;
  const char* description = nullptr;
  if (cuGetErrorName == nullptr || cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) {
    return absl::StrCat("CUresult ", static_cast<int>(result));
  }
  if (cuGetErrorString(result, &description) != CUDA_SUCCESS || description == nullptr) {
    return name;
  }
  return absl::StrCat(name, " (", description, ")");
}

absl::Status CudaDriver::CudaStatus(CUresult result, std::string_view what) const {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::Status(CodeFor(result), absl::StrCat(absl::string_view(what.data(), what.size()), ": ",
                                                    ErrorText(result)));
}

absl::StatusOr<std::string> CudaDriver::DeviceUuid(CUdevice device) const {
  if (!available()) return absl::UnavailableError(absl::StrCat("cuda: ", unavailable_reason_));
  CUuuid uuid;
  if (CUresult r = cuDeviceGetUuid_v2(&uuid, device); r != CUDA_SUCCESS) {
    return CudaStatus(r, absl::StrCat("cuDeviceGetUuid of cuda device ", device));
  }
  return std::string(uuid.bytes, sizeof(uuid.bytes));
}

absl::StatusOr<CUdevice> CudaDriver::DeviceByUuid(std::string_view uuid) const {
  if (!available()) return absl::UnavailableError(absl::StrCat("cuda: ", unavailable_reason_));
  if (uuid.size() != sizeof(CUuuid::bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda device uuid has ", uuid.size(), " bytes, not 16"));
  }
  int count = 0;
  if (CUresult r = cuDeviceGetCount(&count); r != CUDA_SUCCESS) return CudaStatus(r, "cuDeviceGetCount");
  for (int ordinal = 0; ordinal < count && ordinal < kMaxCudaDevices; ++ordinal) {
    CUdevice device = 0;
    if (CUresult r = cuDeviceGet(&device, ordinal); r != CUDA_SUCCESS) {
      return CudaStatus(r, absl::StrCat("cuDeviceGet ", ordinal));
    }
    CUuuid got;
    if (CUresult r = cuDeviceGetUuid_v2(&got, device); r != CUDA_SUCCESS) {
      return CudaStatus(r, absl::StrCat("cuDeviceGetUuid of cuda device ", ordinal));
    }
    if (std::memcmp(got.bytes, uuid.data(), sizeof(got.bytes)) == 0) return device;
  }
  return absl::FailedPreconditionError(absl::StrCat("device ", FormatGpuUuid(uuid),
                                                    " is not visible in this process (", VisibleDevicesText(),
                                                    ")"));
}

absl::StatusOr<CUcontext> CudaDriver::PrimaryContext(CUdevice device) const {
  if (!available()) return absl::UnavailableError(absl::StrCat("cuda: ", unavailable_reason_));
  if (device < 0 || device >= kMaxCudaDevices) {
    return absl::InvalidArgumentError(absl::StrCat("cuda device ", device, " is out of range"));
  }
  absl::MutexLock lock(&mu_);
  CUcontext& context = primary_contexts_[static_cast<size_t>(device)];
  if (context == nullptr) {
    CUcontext retained = nullptr;
    if (CUresult r = cuDevicePrimaryCtxRetain(&retained, device); r != CUDA_SUCCESS) {
      return CudaStatus(r, absl::StrCat("retain the primary context of cuda device ", device));
    }
    context = retained;
  }
  return context;
}

std::string FormatGpuUuid(std::string_view uuid) {
  if (uuid.size() != 16) return "GPU-<invalid uuid>";
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.data());
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                         b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

absl::StatusOr<ScopedCudaContext> ScopedCudaContext::Push(const CudaDriver& driver, CUdevice device) {
  auto context = driver.PrimaryContext(device);
  if (!context.ok()) return context.status();
  if (CUresult r = driver.cuCtxPushCurrent_v2(*context); r != CUDA_SUCCESS) {
    return driver.CudaStatus(r, absl::StrCat("make the primary context of cuda device ", device, " current"));
  }
  return ScopedCudaContext(&driver);
}

ScopedCudaContext::ScopedCudaContext(ScopedCudaContext&& other) noexcept
    : driver_(std::exchange(other.driver_, nullptr)) {}

ScopedCudaContext::~ScopedCudaContext() {
  if (driver_ == nullptr) return;
  CUcontext popped = nullptr;
  if (CUresult r = driver_->cuCtxPopCurrent_v2(&popped); r != CUDA_SUCCESS) {
    spdlog::error("cuda: restore the previous context: {}", driver_->ErrorText(r));
  }
}

}  // namespace tensord::common
