#include "common/memory/backends.h"

#include "common/memory/host/host_backend.h"
#include "common/memory/host/host_importer.h"

// ---- cuda (built when CMake found cuda.h: TENSORD_HAVE_CUDA) ----
#if defined(TENSORD_HAVE_CUDA)
#include "common/memory/cuda/cuda_backend.h"
#include "common/memory/cuda/cuda_host_importer.h"
#include "common/memory/cuda/cuda_importer.h"
#endif

namespace tensord::common {

#if !defined(TENSORD_HAVE_CUDA)
namespace {
constexpr char kNoCudaReason[] = "this build found no cuda.h (or was configured with TENSORD_WITH_CUDA=OFF)";
}  // namespace
#endif

std::vector<std::unique_ptr<MemoryBackend>> MakeBackends() {
  std::vector<std::unique_ptr<MemoryBackend>> backends;
  backends.push_back(std::make_unique<HostBackend>());
#if defined(TENSORD_HAVE_CUDA)
  // Loads the driver now (the daemon starts once); unavailable without one, never fatal.
  backends.push_back(std::make_unique<CudaBackend>());
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
  importers.push_back(std::make_unique<UnbuiltImporter>(tensord::v1::DEVICE_TYPE_CUDA_HOST, "cuda", kNoCudaReason));
#endif
  return importers;
}

const Importers& ProcessImporters() {
  static const Importers* const importers = new Importers(MakeImporters());
  return *importers;
}

std::vector<MissingBackend> MissingBackends() {
  std::vector<MissingBackend> missing;
#if !defined(TENSORD_HAVE_CUDA)
  missing.push_back({"cuda", tensord::v1::DEVICE_TYPE_CUDA, kNoCudaReason});
#endif
  missing.push_back({"level_zero", tensord::v1::DEVICE_TYPE_ONEAPI, "this version of tensord has no level_zero backend yet"});
  return missing;
}

}  // namespace tensord::common
