#include "common/memory/importer.h"

#include <string>
#include <utility>

namespace tensord::common {

Importers::Importers(std::vector<std::unique_ptr<Importer>> importers) {
  for (std::unique_ptr<Importer>& importer : importers) {
    const tensord::v1::DeviceType type = importer->device_type();
    by_type_[type] = std::move(importer);
  }
}

absl::StatusOr<Importer*> Importers::For(tensord::v1::DeviceType type) const {
  auto it = by_type_.find(type);
  if (it == by_type_.end()) {
    std::string name = tensord::v1::DeviceType_Name(type);
    if (name.empty()) name = std::to_string(static_cast<int>(type));  // a value this build has no name for
    return absl::UnimplementedError("device type " + name + " is not supported by this client build");
  }
  return it->second.get();
}

absl::Status UnbuiltImporter::Unbuilt(const std::string& what) const {
  return absl::UnimplementedError(what + ": " + tensord::v1::DeviceType_Name(type_) + " needs the " + backend_ +
                                  " backend, which this build does not have: " + reason_);
}

absl::StatusOr<std::unique_ptr<ImportedRegion>> UnbuiltImporter::Import(const FetchedBuffer& buffer, MapMode mode,
                                                                        const std::string& what) {
  (void)buffer;
  (void)mode;
  return Unbuilt(what);
}

absl::Status UnbuiltImporter::NameDevice(tensord::v1::Device& device) const {
  return Unbuilt("device " + std::to_string(device.index()));
}

absl::Status Importers::NameDevice(tensord::v1::Device& device) const {
  absl::StatusOr<Importer*> importer = For(device.type());
  if (!importer.ok()) return importer.status();
  return (*importer)->NameDevice(device);
}

}  // namespace tensord::common
