#include "common/memory/backends.h"

#include "common/memory/host/host_backend.h"
#include "common/memory/host/host_importer.h"

namespace tensord::common {

std::vector<std::unique_ptr<MemoryBackend>> MakeBackends() {
  std::vector<std::unique_ptr<MemoryBackend>> backends;
  backends.push_back(std::make_unique<HostBackend>());
  return backends;
}

std::vector<std::unique_ptr<Importer>> MakeImporters() {
  std::vector<std::unique_ptr<Importer>> importers;
  importers.push_back(std::make_unique<HostImporter>());
  return importers;
}

const Importers& ProcessImporters() {
  static const Importers* const importers = new Importers(MakeImporters());
  return *importers;
}

std::vector<MissingBackend> MissingBackends() {
  std::vector<MissingBackend> missing;
  missing.push_back({"cuda", tensord::v1::DEVICE_TYPE_CUDA, "not built: CMake found no cuda.h"});
  missing.push_back({"level_zero", tensord::v1::DEVICE_TYPE_ONEAPI, "not built yet: the level_zero backend is future work"});
  return missing;
}

}  // namespace tensord::common
