#include "common/memory/host_backend.h"

#include "common/memory/memfd.h"
#include "common/status.h"

namespace tensord::common {

absl::StatusOr<std::unique_ptr<BackendBuffer>> HostBackend::Allocate(
    uint64_t size, const std::string& debug_name) {
  TENSORD_ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd(debug_name, size));
  return std::make_unique<HostBuffer>(std::move(fd), size);
}

}  // namespace tensord::common
