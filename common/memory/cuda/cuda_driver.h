// CudaDriver: the CUDA driver API, loaded at run time into a table of entry points, so one
// build runs on machines with and without an NVIDIA driver. Nothing links libcuda.
//
// CudaDriver::Get() loads it once per process (thread-safe, never fails): dlopen of
// "libcuda.so.1" (RTLD_NOW|RTLD_LOCAL), dlsym of exactly the entry points below, cuInit(0).
// Any step that fails leaves the driver unavailable, with unavailable_reason() saying
// which step and why; the entry points are then null and must not be called. The
// environment variable TENSORD_LIBCUDA names another library to load instead: a test hook
// (tests point it at tests/fake_cuda's libtensord_fake_cuda.so), read once, at first use.
//
// Symbols are resolved by the versioned names cuda.h's #defines map the API names to
// (cuDeviceTotalMem -> cuDeviceTotalMem_v2, ...): the members carry those names, and their
// types are decltype of cuda.h's own declarations, so a mismatch does not compile.
//
// Contexts. The VMM calls (cuMemCreate, cuMemExportToShareableHandle, cuMemImport...,
// cuMemAddressReserve, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
// cuMemGetAllocationGranularity) take a device in a CUmemLocation and do not list
// CUDA_ERROR_INVALID_CONTEXT among their results in cuda.h; legacy IPC
// (cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle), cuMemGetAddressRange,
// cuMemHostRegister / cuMemHostUnregister and copies do, and work in the current context.
// cuPointerGetAttribute is called without one (unified addressing names the device from
// the pointer; not checked on hardware). So nothing here creates a context until a caller
// asks for one with ScopedCudaContext: the daemon, which only makes VMM calls, never does,
// and costs a GPU no context memory.
//
// Primary contexts are retained once per device per process, on first use, and never
// released: a client that opened legacy IPC memory must keep the context the pointers
// live in for as long as any region may still be closed (a DLPack deleter can run during
// exit), and releasing from a static destructor would race the driver's own teardown at
// exit. The process's exit frees the context; in a process that uses CUDA anyway (torch)
// it is the same primary context the runtime retains.
//
// Thread-safety: the table is immutable after Get() returns; PrimaryContext is
// thread-safe. Error codes: CudaStatus maps CUresult to canonical codes (see below).
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tensord::common {

// X(symbol): every entry point CudaDriver resolves, by the name the library exports.
#define TENSORD_CUDA_DRIVER_ENTRY_POINTS(X) \
  X(cuGetErrorName)                         \
  X(cuGetErrorString)                       \
  X(cuInit)                                 \
  X(cuDeviceGetCount)                       \
  X(cuDeviceGet)                            \
  X(cuDeviceGetName)                        \
  X(cuDeviceGetUuid_v2)                     \
  X(cuDeviceTotalMem_v2)                    \
  X(cuDeviceGetAttribute)                   \
  X(cuDevicePrimaryCtxRetain)               \
  X(cuDevicePrimaryCtxRelease_v2)           \
  X(cuCtxPushCurrent_v2)                    \
  X(cuCtxPopCurrent_v2)                     \
  X(cuMemGetAllocationGranularity)          \
  X(cuMemCreate)                            \
  X(cuMemRelease)                           \
  X(cuMemExportToShareableHandle)           \
  X(cuMemImportFromShareableHandle)         \
  X(cuMemAddressReserve)                    \
  X(cuMemAddressFree)                       \
  X(cuMemMap)                               \
  X(cuMemUnmap)                             \
  X(cuMemSetAccess)                         \
  X(cuPointerGetAttribute)                  \
  X(cuMemGetAddressRange_v2)                \
  X(cuIpcGetMemHandle)                      \
  X(cuIpcOpenMemHandle_v2)                  \
  X(cuIpcCloseMemHandle)                    \
  X(cuMemcpyHtoD_v2)                        \
  X(cuMemcpyDtoH_v2)                        \
  X(cuMemHostRegister_v2)                   \
  X(cuMemHostUnregister)                    \
  X(cuEventCreate)                          \
  X(cuEventRecord)                          \
  X(cuEventQuery)                           \
  X(cuEventSynchronize)                     \
  X(cuEventDestroy_v2)                      \
  X(cuIpcGetEventHandle)                    \
  X(cuIpcOpenEventHandle)                   \
  X(cuStreamWaitEvent)                      \
  X(cuMemcpyDtoDAsync_v2)

// How many devices a process can see at most; ordinals beyond are refused.
inline constexpr int kMaxCudaDevices = 64;

class CudaDriver {
 public:
  // The process's driver, loaded on the first call. Never null.
  static const CudaDriver& Get();

  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  bool available() const { return unavailable_reason_.empty(); }
  // Empty when available; else what failed, e.g. "libcuda.so.1 not found (dlopen: ...):
  // no NVIDIA driver on this machine", "libcuda.so.1 lacks cuMemCreate (dlsym: ...)",
  // "no CUDA device: cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)".
  const std::string& unavailable_reason() const { return unavailable_reason_; }
  // The library that was (or was to be) loaded.
  const std::string& library() const { return library_; }

  // OK for CUDA_SUCCESS; else "<what>: CUDA_ERROR_X (driver's description)" with the code
  // that fits: OUT_OF_MEMORY -> RESOURCE_EXHAUSTED, INVALID_VALUE/HANDLE -> INVALID_ARGUMENT,
  // INVALID_DEVICE/CONTEXT, ALREADY_MAPPED -> FAILED_PRECONDITION, NOT_PERMITTED ->
  // PERMISSION_DENIED, NOT_SUPPORTED -> UNIMPLEMENTED, NO_DEVICE/NOT_INITIALIZED/
  // DEINITIALIZED -> UNAVAILABLE, anything else INTERNAL.
  absl::Status CudaStatus(CUresult result, std::string_view what) const;
  // "CUDA_ERROR_X (description)", or the number when the driver cannot name it.
  std::string ErrorText(CUresult result) const;

  // The device this process calls ordinal `uuid` (16 raw bytes), by cuDeviceGetUuid over
  // the visible devices. FAILED_PRECONDITION "device GPU-... is not visible in this
  // process (CUDA_VISIBLE_DEVICES=...)" when none has it; UNAVAILABLE when the driver is.
  absl::StatusOr<CUdevice> DeviceByUuid(std::string_view uuid) const;
  // The UUID (16 raw bytes) of `device`.
  absl::StatusOr<std::string> DeviceUuid(CUdevice device) const;

  // `device`'s primary context, retained on first use and kept for the process's life.
  absl::StatusOr<CUcontext> PrimaryContext(CUdevice device) const;

  // The entry points, named as exported; null when unavailable.
#define TENSORD_CUDA_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  TENSORD_CUDA_DRIVER_ENTRY_POINTS(TENSORD_CUDA_DRIVER_MEMBER)
#undef TENSORD_CUDA_DRIVER_MEMBER

 private:
  CudaDriver() = default;
  void Load();

  std::string library_;
  std::string unavailable_reason_;
  void* dl_handle_ = nullptr;  // never dlclose'd: the table points into it

  mutable absl::Mutex mu_;
  mutable std::array<CUcontext, kMaxCudaDevices> primary_contexts_ ABSL_GUARDED_BY(mu_){};
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi's spelling) of 16 raw bytes;
// "GPU-<invalid uuid>" when `uuid` is not 16 bytes.
std::string FormatGpuUuid(std::string_view uuid);

// Makes `device`'s primary context current on this thread for the guard's lifetime
// (cuCtxPushCurrent / cuCtxPopCurrent), restoring whatever was current before. Move-only;
// the destructor logs a failed pop and never throws.
class ScopedCudaContext {
 public:
  static absl::StatusOr<ScopedCudaContext> Push(const CudaDriver& driver, CUdevice device);
  ScopedCudaContext(ScopedCudaContext&& other) noexcept;
  ScopedCudaContext& operator=(ScopedCudaContext&&) = delete;
  ScopedCudaContext(const ScopedCudaContext&) = delete;
  ScopedCudaContext& operator=(const ScopedCudaContext&) = delete;
  ~ScopedCudaContext();

 private:
  explicit ScopedCudaContext(const CudaDriver* driver) : driver_(driver) {}
  const CudaDriver* driver_;  // null once moved from
};

}  // namespace tensord::common
