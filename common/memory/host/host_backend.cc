#include "common/memory/host/host_backend.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "common/memory/host/memfd.h"
#include "common/status.h"

namespace tensord::common {

absl::StatusOr<MemoryHandle> HostBuffer::Export() const {
  int fd = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus("dup the memfd of a host buffer", errno);
  MemoryHandle handle;
  handle.fds.emplace_back(fd);
  return handle;
}

absl::Status HostBuffer::CheckShareable(const std::string& what) const {
  return CheckReaderSeals(fd_.get(), what);
}

std::vector<BackendDevice> HostBackend::devices() const {
  BackendDevice host;
  host.device.set_type(tensord::v1::DEVICE_TYPE_CPU);
  host.name = "host memory";
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) host.total_bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  return {host};
}

uint64_t HostBackend::RoundUp(const BackendDevice& /*device*/, uint64_t size) const {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return (size + page - 1) / page * page;
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> HostBackend::Allocate(const BackendDevice& /*device*/,
                                                                     uint64_t size,
                                                                     const std::string& debug_name) {
  TENSORD_ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd(debug_name, size));
  return std::make_unique<HostBuffer>(std::move(fd), size, /*made_here=*/true);
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> HostBackend::Adopt(const BackendDevice& /*device*/,
                                                                  MemoryHandle handle, uint64_t /*size*/,
                                                                  const std::string& what) {
  if (handle.fds.size() != 1 || !handle.data.empty()) {
    return absl::InvalidArgumentError(what + ": host memory is exported as one memfd and no handle bytes");
  }
  TENSORD_ASSIGN_OR_RETURN(uint64_t actual, PrepareExportedMemfd(handle.fds[0].get(), what));
  return std::make_unique<HostBuffer>(std::move(handle.fds[0]), actual, /*made_here=*/false);
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> HostBackend::Restore(const BackendDevice& /*device*/,
                                                                    MemoryHandle handle, uint64_t size,
                                                                    const std::string& what) {
  if (handle.fds.size() != 1 || !handle.data.empty()) {
    return absl::FailedPreconditionError(what + ": a host buffer is one memfd and no handle bytes, not " +
                                         std::to_string(handle.fds.size()) + " fds and " +
                                         std::to_string(handle.data.size()) + " bytes");
  }
  TENSORD_RETURN_IF_ERROR(CheckReaderSeals(handle.fds[0].get(), what));
  TENSORD_ASSIGN_OR_RETURN(uint64_t actual, FdSize(handle.fds[0].get(), what));
  if (actual != size) {
    return absl::FailedPreconditionError(what + ": the memfd holds " + std::to_string(actual) + " bytes, not the " +
                                         std::to_string(size) + " its entry says");
  }
  // Not recyclable: no producer keeps a writable mapping of it any more.
  return std::make_unique<HostBuffer>(std::move(handle.fds[0]), size, /*made_here=*/false);
}

}  // namespace tensord::common
