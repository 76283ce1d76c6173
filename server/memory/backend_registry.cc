#include "server/memory/backend_registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/memory/device_names.h"
#include "common/memory/host/host_backend.h"
#include "common/memory/memory_kinds.h"

namespace tensord::server {

namespace v1 = tensord::v1;

BackendRegistry::BackendRegistry(std::vector<std::unique_ptr<common::MemoryBackend>> backends,
                                 std::vector<common::MissingBackend> missing)
    : backends_(std::move(backends)), missing_(std::move(missing)) {
  for (const std::unique_ptr<common::MemoryBackend>& backend : backends_) {
    if (!backend->unavailable_reason().empty()) continue;
    for (common::BackendDevice& device : backend->devices()) {
      ResolvedDevice resolved;
      resolved.backend = backend.get();
      resolved.key = common::DeviceKey(device.device);
      resolved.device = std::move(device);
      devices_.push_back(std::move(resolved));
    }
  }
  TENSORD_CHECK(!devices_.empty() && devices_.front().device.device.type() == v1::DEVICE_TYPE_CPU);
}

absl::StatusOr<const ResolvedDevice*> BackendRegistry::Resolve(const v1::Device& device) const {
  const v1::DeviceType type = device.type();
  if (type == v1::DEVICE_TYPE_CPU) return &host();
  const std::string backend_name = common::BackendNameOf(type);
  const common::MemoryBackend* backend = nullptr;
  for (const std::unique_ptr<common::MemoryBackend>& candidate : backends_) {
    if (candidate->device_type() == type) backend = candidate.get();
  }
  if (backend == nullptr) {
    for (const common::MissingBackend& missing : missing_) {
      if (missing.device_type == type) {
        return absl::FailedPreconditionError(
            absl::StrCat("this tensord has no ", missing.name, " backend: ", missing.reason));
      }
    }
    if (const common::MemoryKind* kind = common::FindMemoryKind(type); kind != nullptr && !kind->own_memory) {
      return absl::InvalidArgumentError(absl::StrCat("desc.device: ", v1::DeviceType_Name(type),
                                                     " is a view of host memory a client asks for, not memory "
                                                     "the broker allocates: allocate host (CPU) memory"));
    }
    return absl::FailedPreconditionError(absl::StrCat("this tensord serves no ", backend_name, " memory"));
  }
  if (std::string reason = backend->unavailable_reason(); !reason.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("the ", backend_name, " backend is unavailable: ", reason));
  }
  std::vector<std::string> have;
  for (const ResolvedDevice& candidate : devices_) {
    if (candidate.backend != backend) continue;
    const v1::Device& d = candidate.device.device;
    const bool match = device.uuid().empty() ? d.index() == device.index() : d.uuid() == device.uuid();
    if (match) return &candidate;
    have.push_back(absl::StrCat(backend_name, ":", d.index(), " ", common::FormatDeviceUuid(type, d.uuid())));
  }
  const std::string asked = device.uuid().empty() ? absl::StrCat(backend_name, ":", device.index())
                                                  : common::FormatDeviceUuid(type, device.uuid());
  return absl::NotFoundError(absl::StrCat("no device ", asked, " on this node; the ", backend_name, " backend has ",
                                          have.empty() ? "none" : absl::StrJoin(have, ", ")));
}

std::vector<v1::BackendStatus> BackendRegistry::Describe() const {
  std::vector<v1::BackendStatus> out;
  for (const std::unique_ptr<common::MemoryBackend>& backend : backends_) {
    v1::BackendStatus status;
    status.set_name(std::string(backend->name()));
    status.set_device_type(backend->device_type());
    status.set_built(true);
    status.set_unavailable_reason(backend->unavailable_reason());
    for (const ResolvedDevice& device : devices_) {
      if (device.backend != backend.get()) continue;
      v1::DeviceUsage* usage = status.add_devices();
      *usage->mutable_device() = device.device.device;
      usage->set_name(device.device.name);
      usage->set_total_bytes(device.device.total_bytes);
    }
    out.push_back(std::move(status));
  }
  for (const common::MissingBackend& missing : missing_) {
    v1::BackendStatus status;
    status.set_name(missing.name);
    status.set_device_type(missing.device_type);
    status.set_built(false);
    status.set_unavailable_reason(missing.reason);
    out.push_back(std::move(status));
  }
  return out;
}

std::unique_ptr<BackendRegistry> HostOnlyBackends() {
  std::vector<std::unique_ptr<common::MemoryBackend>> backends;
  backends.push_back(std::make_unique<common::HostBackend>());
  return std::make_unique<BackendRegistry>(std::move(backends), std::vector<common::MissingBackend>());
}

}  // namespace tensord::server
