// MemoryKind: what every part of tensord knows about a kind of memory without loading its
// backend: its names, its DLPack device type, how users spell its devices, and what a DLPack
// consumer's `stream` means for it. Each kind describes itself in its own folder
// (host/host_kind.h, cuda/cuda_kind.h, level_zero/ze_kind.h) and is registered once, in the
// table in memory_kinds.cc; the broker's errors, device keys, tensorctl's output and the
// Python module's device names and stream rules all read that table. A build without a
// kind's driver headers still knows the kind (it can name it in an error), only not its
// backend (backends.cc).
#pragma once

#include <cstdint>
#include <string_view>

#include "tensord/v1/tensor.pb.h"

namespace tensord::common {

// What `stream` in DLPack's __dlpack__(stream=...) means for memory of a kind.
enum class StreamRule : uint8_t {
  kNone,       // host memory: nothing to order; a consumer's stream is ignored
  kCuda,       // None: the legacy default stream (1); 0 is ambiguous and refused; -1: no
               // ordering; else a CUstream of the consumer's
  kHostWait,   // no default stream (Level Zero): None waits on the host; -1: no ordering;
               // else a command list (ze_command_list_handle_t) in tensord's context
};

struct MemoryKind {
  tensord::v1::DeviceType type;   // the same number as its DLDeviceType
  std::string_view name;          // "host", "cuda": status output, errors, device keys
  std::string_view device_prefix; // "cpu", "cuda", "xpu": how users and torch name its devices
  bool numbered;                  // devices are "cuda:1"; false: one device, "cpu"
  bool host_readable;             // the CPU reads its bytes through a plain pointer
  bool own_memory;                // false: a view of another kind's memory (cuda_host)
  StreamRule streams;
  std::string_view uuid_prefix;   // before a device UUID, as the vendor's tools print it ("GPU-")
};

}  // namespace tensord::common
