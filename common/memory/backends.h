// The memory backends and importers this build has. Host memory is always there; a GPU
// backend is built when CMake found its headers, and loads its driver at run time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/memory/importer.h"
#include "common/memory/memory_backend.h"

namespace tensord::common {

// Server side, host first.
std::vector<std::unique_ptr<MemoryBackend>> MakeBackends();
// Client side, host first.
std::vector<std::unique_ptr<Importer>> MakeImporters();
// The importers of this process, made on first use and never destroyed: a region may be
// unmapped by a DLPack deleter at any time, also while the process exits, and importers
// keep per-process driver state (a GPU importer's opened handles).
const Importers& ProcessImporters();

// The Level Zero context (of `driver`) this process's imports use: ZeProcessContexts::Use
// (level_zero/ze_importer.h). UNIMPLEMENTED in a build without the level_zero backend.
absl::Status UseLevelZeroContext(void* driver, void* context);

// A backend this build does not have, and why, for `tensorctl status`.
struct MissingBackend {
  std::string name;
  tensord::v1::DeviceType device_type;
  std::string reason;
};
std::vector<MissingBackend> MissingBackends();

}  // namespace tensord::common
