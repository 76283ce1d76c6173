// BackendRegistry: the broker's memory backends by device. A tensor description names a
// device by type, ordinal and (for a GPU) UUID; Resolve turns it into the backend and the
// device that serve it, and the key quotas and status use (common/memory/device_names.h).
// The UUID wins over the ordinal when both are given: ordinals differ between processes.
//
// Backends report their devices once, at construction (a GPU backend asks its driver
// then); a backend that is unavailable stays listed with its reason, and so does one this
// build does not have. Constant after construction: thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/memory/backends.h"
#include "common/memory/memory_backend.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::server {

struct ResolvedDevice {
  common::MemoryBackend* backend = nullptr;
  common::BackendDevice device;
  std::string key;  // "host", "cuda:GPU-..."
};

class BackendRegistry {
 public:
  // `backends` must hold a host backend.
  BackendRegistry(std::vector<std::unique_ptr<common::MemoryBackend>> backends,
                  std::vector<common::MissingBackend> missing);

  // FAILED_PRECONDITION when the device type's backend is not built or unavailable (the
  // message says why), NOT_FOUND when the backend has no such device (the message lists
  // the devices it has), INVALID_ARGUMENT for a type no backend serves (CUDA host memory
  // is a view a client asks for, never an allocation).
  absl::StatusOr<const ResolvedDevice*> Resolve(const tensord::v1::Device& device) const;
  const ResolvedDevice& host() const { return devices_.front(); }
  // Every device of every available backend, host first.
  const std::vector<ResolvedDevice>& devices() const { return devices_; }
  // Every backend, built or not, with its devices (usage left at zero for the caller).
  std::vector<tensord::v1::BackendStatus> Describe() const;

 private:
  std::vector<std::unique_ptr<common::MemoryBackend>> backends_;
  std::vector<common::MissingBackend> missing_;
  std::vector<ResolvedDevice> devices_;
};

// Host memory only: for tests and tools that need no device.
std::unique_ptr<BackendRegistry> HostOnlyBackends();

}  // namespace tensord::server
