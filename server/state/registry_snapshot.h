// The registry snapshot file: a RegistrySnapshot (proto/tensord/v1/registry_snapshot.proto)
// in a sealed memfd, the way a daemon hands its named tensors to the daemon that takes over
// (server/daemon/take_over.h).
//
// Layout: a 32-byte header, then the serialized message.
//   0  magic "TNSDSNAP"          16  payload bytes (u64, little-endian)
//   8  format version (u32)      24  FNV-1a 64 of the payload (u64)
//   12 zero (u32)
// The memfd is sealed against every change (F_SEAL_WRITE|SHRINK|GROW|SEAL) before it is
// sent, so what the reader checks is what it reads.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "tensord/v1/registry_snapshot.pb.h"

namespace tensord::server {

inline constexpr uint32_t kSnapshotFormatVersion = 1;
// A registry larger than this is refused on both sides: it would not be a registry.
inline constexpr uint64_t kMaxSnapshotBytes = uint64_t{1} << 30;

absl::StatusOr<common::UniqueFd> WriteSnapshotMemfd(const tensord::v1::RegistrySnapshot& snapshot);

// FAILED_PRECONDITION saying what is wrong: not a sealed memfd, a short file, the wrong
// magic or version, a payload size that does not match the file, a bad checksum, a payload
// that does not parse.
absl::StatusOr<tensord::v1::RegistrySnapshot> ReadSnapshotMemfd(int fd);

// The name fd `n` of buffer `buffer_id` goes by in a snapshot's fd_names, and so in systemd's
// fd store (server/daemon/fd_store.h): "b<buffer id>-<n>".
std::string StoredFdName(uint64_t buffer_id, size_t n);

}  // namespace tensord::server
