// DeviceStager: copies device tensors to host memory and back, so that they can cross nodes
// over the host-memory data path, through the staging helper (tensord-stage,
// server/staging/). The helper is a process of the daemon's own, started at the first copy
// and kept for the next: it makes the device context the copies need, so the daemon makes
// none (a context costs device memory on every GPU it touches and ties the daemon to the
// driver). The helper inherits the daemon's environment (CUDA_VISIBLE_DEVICES,
// TENSORD_LIBCUDA) and imports buffers through the same importers a client uses.
//
// Host memory is a memfd of exactly the tensor's extent, which the caller makes and maps;
// the helper maps it too. Copies run one at a time. A helper that dies or does not answer
// within `timeout` fails the copy UNAVAILABLE, saying so (a hung one is killed), and the
// next copy starts a new one. A missing helper binary: FAILED_PRECONDITION naming its path.
// Thread-safe; the destructor closes the socket, on which the helper exits, and reaps it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/memory/host/mapped_region.h"
#include "common/memory/importer.h"
#include "common/memory/memory_handle.h"
#include "common/unique_fd.h"
#include "tensord/v1/tensor.pb.h"

namespace tensord::cluster::v1 {
class StageRequest;
}

namespace tensord::server::cluster {

// Host memory a device tensor's bytes pass through: a memfd of exactly `nbytes` (outside
// the broker's host quota: one per open read or pull of a device tensor, gone with it),
// mapped read-write here for the network and passed to the helper by its fd.
class HostCopy final : public common::ImportedRegion {
 public:
  // RESOURCE_EXHAUSTED naming `what` when the node cannot back it.
  static absl::StatusOr<std::unique_ptr<HostCopy>> Make(uint64_t nbytes, const std::string& what);
  int fd() const { return fd_.get(); }
  uint8_t* data() const override { return mapping_.data(); }
  uint64_t size() const override { return mapping_.size(); }
  common::MapMode mode() const override { return common::MapMode::kSharedWritable; }

 private:
  HostCopy(common::UniqueFd fd, common::MappedRegion mapping) : fd_(std::move(fd)), mapping_(std::move(mapping)) {}
  common::UniqueFd fd_;
  common::MappedRegion mapping_;
};

// A device buffer as the broker exports it (Broker::FetchHandles).
struct DeviceBuffer {
  tensord::v1::DeviceType device_type = tensord::v1::DEVICE_TYPE_UNSPECIFIED;
  uint64_t size = 0;
  const common::MemoryHandle* handle = nullptr;  // its fds are sent, not taken
};

class DeviceStager {
 public:
  explicit DeviceStager(std::string helper_path, absl::Duration timeout = absl::Minutes(2));
  ~DeviceStager();
  DeviceStager(const DeviceStager&) = delete;
  DeviceStager& operator=(const DeviceStager&) = delete;

  // Copies the `nbytes` at `offset` of `buffer` into `host_fd` once the producer's
  // `ready_fence` (empty: none) has passed. Errors name `what`.
  absl::Status ToHost(const DeviceBuffer& buffer, uint64_t offset, uint64_t nbytes, const std::string& ready_fence,
                      int host_fd, const std::string& what);
  // Copies `nbytes` from `host_fd` to `offset` of `buffer`, and returns once they are on the
  // device: a reader's stream may use them with no fence.
  absl::Status ToDevice(const DeviceBuffer& buffer, uint64_t offset, uint64_t nbytes, int host_fd,
                        const std::string& what);

  // The helper's pid; 0 while none runs (waits for a copy under way).
  pid_t helper_pid() const;
  // Copies done since this stager began (never waits).
  uint64_t copies() const { return copies_.load(std::memory_order_relaxed); }

 private:
  absl::Status Call(tensord::cluster::v1::StageRequest& request, const DeviceBuffer& buffer, int host_fd);
  absl::Status StartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the socket and reaps the helper (SIGKILL first when `kill`); says how it ended.
  std::string StopLocked(bool kill) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string helper_path_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;  // one copy at a time
  common::UniqueFd socket_ ABSL_GUARDED_BY(mu_);
  pid_t pid_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> copies_{0};
};

}  // namespace tensord::server::cluster
