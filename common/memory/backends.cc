#include "common/memory/backends.h"

#include "common/memory/cuda/cuda_kind.h"
#include "common/memory/host/host_backend.h"
#include "common/memory/host/host_importer.h"
#include "common/memory/level_zero/ze_kind.h"

// ---- cuda (built when CMake found cuda.h: TENSORD_HAVE_CUDA) ----
#if defined(TENSORD_HAVE_CUDA)
#include "common/memory/cuda/cuda_backend.h"
#include "common/memory/cuda/cuda_host_importer.h"
#include "common/memory/cuda/cuda_importer.h"
#endif

// ---- level_zero (built when CMake found level_zero/ze_api.h: TENSORD_HAVE_LEVEL_ZERO) ----
#if defined(TENSORD_HAVE_LEVEL_ZERO)
#include "common/memory/level_zero/ze_backend.h"
#include "common/memory/level_zero/ze_importer.h"
#endif

namespace tensord::common {

namespace {
#if !defined(TENSORD_HAVE_CUDA)
constexpr char kNoCudaReason[] = "this build found no cuda.h (or was configured with TENSORD_WITH_CUDA=OFF)";
#endif
#if !defined(TENSORD_HAVE_LEVEL_ZERO)
constexpr char kNoLevelZeroReason[] =
    "this build found no level_zero/ze_api.h (Debian: libze-dev; or was configured with TENSORD_WITH_LEVEL_ZERO=OFF)";
#endif
}  // namespace

std::vector<std::unique_ptr<MemoryBackend>> MakeBackends() {
  std::vector<std::unique_ptr<MemoryBackend>> backends;
  backends.push_back(std::make_unique<HostBackend>());
#if defined(TENSORD_HAVE_CUDA)
  // Loads the driver now (the daemon starts once); unavailable without one, never fatal.
  backends.push_back(std::make_unique<CudaBackend>());
#endif
#if defined(TENSORD_HAVE_LEVEL_ZERO)
  // Loads the loader and its drivers now; unavailable without them, never fatal.
  backends.push_back(std::make_unique<ZeBackend>());
#endif
  return backends;
}

std::vector<std::unique_ptr<Importer>> MakeImporters() {
  std::vector<std::unique_ptr<Importer>> importers;
  importers.push_back(std::make_unique<HostImporter>());
#if defined(TENSORD_HAVE_CUDA)
  // Loads the driver at its first import, so host-only clients never pay for cuInit.
  importers.push_back(std::make_unique<CudaImporter>());
  // Pinned views of host memory: the host import, registered with the cuda driver.
  importers.push_back(std::make_unique<CudaHostImporter>(std::make_unique<HostImporter>()));
#else
  importers.push_back(std::make_unique<UnbuiltImporter>(kCudaHostKind.type, std::string(kCudaKind.name), kNoCudaReason));
#endif
#if defined(TENSORD_HAVE_LEVEL_ZERO)
  // Loads the loader at its first import, so host-only clients never pay for zeInit.
  importers.push_back(std::make_unique<ZeImporter>());
#else
  importers.push_back(
      std::make_unique<UnbuiltImporter>(kLevelZeroKind.type, std::string(kLevelZeroKind.name), kNoLevelZeroReason));
#endif
  return importers;
}

const Importers& ProcessImporters() {
  static const Importers* const importers = new Importers(MakeImporters());
  return *importers;
}

absl::Status UseLevelZeroContext(void* driver, void* context) {
#if defined(TENSORD_HAVE_LEVEL_ZERO)
  return ZeProcessContexts::Get().Use(static_cast<ze_driver_handle_t>(driver), static_cast<ze_context_handle_t>(context));
#else
  (void)driver;
  (void)context;
  return absl::UnimplementedError(std::string("use a Level Zero context: ") + kNoLevelZeroReason);
#endif
}

std::vector<MissingBackend> MissingBackends() {
  std::vector<MissingBackend> missing;
#if !defined(TENSORD_HAVE_CUDA)
  missing.push_back({std::string(kCudaKind.name), kCudaKind.type, kNoCudaReason});
#endif
#if !defined(TENSORD_HAVE_LEVEL_ZERO)
  missing.push_back({std::string(kLevelZeroKind.name), kLevelZeroKind.type, kNoLevelZeroReason});
#endif
  return missing;
}

}  // namespace tensord::common
