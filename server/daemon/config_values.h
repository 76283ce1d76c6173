// The value grammar of the daemon's settings, the same for flags, environment variables
// and the config file (config.h).
//
// Values are checked, never guessed at; a bad one is INVALID_ARGUMENT naming where it came
// from (the flag, the environment variable, or the file, line and key), the value and why:
//  - a size is a decimal number with an optional unit: 512MiB, 4G, 1.5GiB, 2GB (K/M/G/T and
//    KiB/MiB/GiB/TiB are binary, like the rest of Linux memory tooling; KB/MB/GB/TB decimal;
//    units in any case). A fraction needs a unit and must come to a whole number of bytes;
//    the result is from 1 byte to 2^63-1 (arena sizes may also be 0: off);
//  - a count is a plain decimal integer from 1 to 2^32;
//  - neither takes a sign, hexadecimal, leading zeros, an exponent or inner whitespace
//    (whitespace around the value is ignored);
//  - in the file, a count must be a TOML integer, a size a TOML integer (bytes) or string,
//    text settings TOML strings; booleans, floats, arrays, tables and dates are refused, and
//    so is any key the daemon does not know (a misspelt key would do nothing).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/memory/memory_quota.h"

namespace tensord::server {

// Caps are counts of things held in memory: 2^32 is far beyond what a node can hold.
inline constexpr uint64_t kMaxCount = uint64_t{1} << 32;

// A size by the rules above. Errors give the reason only; callers say where the text came from.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text);
// A count by the rules above, reason-only errors likewise.
absl::StatusOr<uint64_t> ParseCount(absl::string_view text);
// "512MiB" -> 536870912, by the rules above. INVALID_ARGUMENT naming the text and the reason.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

// Parses "SIZE" or "NAME=SIZE[,NAME=SIZE...]" (a bare SIZE may lead the list: the value
// for devices not named). INVALID_ARGUMENT naming the entry and why.
absl::StatusOr<DeviceLimits> ParseDeviceLimits(std::string_view text);

// The gid of an existing group, given by name or by number (decimal digits only: a gid from
// 0 to 2^32-2, since (gid_t)-1 tells chown to leave the group alone). Thread-safe (the
// getgr*_r calls). INVALID_ARGUMENT saying why when no such group exists or the number does
// not fit gid_t; the errno's code when the group database cannot be read. The message does
// not repeat `group`: the caller says where it came from.
absl::StatusOr<gid_t> LookUpGroup(std::string_view group);

}  // namespace tensord::server
