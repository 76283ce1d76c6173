// MemoryHandle: what a reader needs to import one buffer, as it travels on the fd channel
// (tensord.v1.MemoryHandle plus the fds attached to the message). `data` is opaque to the
// broker and the wire: only the importer of the buffer's device type reads it.
#pragma once

#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace tensord::common {

struct MemoryHandle {
  std::string data;            // empty for host memory
  std::vector<UniqueFd> fds;   // host: the memfd; CUDA VMM: one; legacy CUDA IPC: none
};

}  // namespace tensord::common
