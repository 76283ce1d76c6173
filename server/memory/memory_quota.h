// MemoryQuota: the bytes of device memory the daemon has handed out, per device, against a
// limit per device. A device is named by its key: kHost ("host") for host memory; a GPU will
// be "cuda:GPU-<uuid>". Every buffer the broker makes or adopts is reserved here first, in
// whole (page-rounded) buffer sizes, and released when the buffer is freed.
//
// Reserve takes the whole amount or nothing. Release gives back what a Reserve took: a
// release of more than is in use is a broken invariant and crashes. A key that SetLimit
// never named has no memory to give: every reservation on it of more than 0 bytes fails.
//
// Errors: RESOURCE_EXHAUSTED naming what needed the memory, the device, the bytes in use,
// the limit and the flag that sets it.
// Not thread-safe: the Broker guards it with its mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tensord::server {

// --max-device-bytes: the quota of each GPU's broker-owned and exported memory. `all`
// binds every device not named in `by_device`; a device with neither is bounded by its
// own memory only. Names are as `tensorctl status` shows devices: a UUID ("GPU-...") or
// "<backend>:<daemon ordinal>" ("cuda:0").
struct DeviceLimits {
  uint64_t all = 0;  // 0: none
  std::map<std::string, uint64_t> by_device;
  std::string source;  // where the setting came from, for errors that name the limit
};

class MemoryQuota {
 public:
  // The key of host memory (--max-host-bytes).
  static constexpr std::string_view kHost = "host";

  // Sets (or changes) the limit of `key`; `flag` names the flag that sets it ("--max-host-bytes").
  void SetLimit(std::string_view key, uint64_t bytes, std::string_view flag);
  // Adds `bytes` to what `key` has in use, or fails with nothing reserved when that would
  // pass its limit. `what` says what needs the memory ("exporting a memfd").
  absl::Status Reserve(std::string_view key, uint64_t bytes, std::string_view what);
  void Release(std::string_view key, uint64_t bytes);

  uint64_t InUse(std::string_view key) const;
  // 0 for a key SetLimit never named.
  uint64_t Limit(std::string_view key) const;

 private:
  struct Device {
    uint64_t limit = 0;
    uint64_t in_use = 0;
    std::string flag;
  };
  std::map<std::string, Device, std::less<>> devices_;  // a few devices at most
};

}  // namespace tensord::server
