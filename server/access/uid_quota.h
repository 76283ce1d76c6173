// UidQuota: what each uid holds in the daemon, against the per-uid limits, so one local
// user cannot take what every other user needs (sessions, tensors, waits, watchers, the
// daemon's own memory for metadata, and host memory outside the namespaces an ACL grants).
//
// Every uid's use is counted; the limits bind every uid except the exempt ones (root and
// the daemon's own uid, which the ACLs trust as well). Reserve either takes the whole
// amount or nothing; Release gives back exactly what a Reserve took (a release of more than
// is held is a broken invariant and crashes). A uid's entry goes once it holds nothing.
//
// Errors: RESOURCE_EXHAUSTED naming the uid, what it holds, the limit and its flag.
// Not thread-safe: the Broker guards it with its mutex.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace tensord::server {

// Defaults of the per-uid caps (UidLimits).
inline constexpr uint64_t kDefaultMaxSessionsPerUid = 1024;
inline constexpr uint64_t kDefaultMaxTensorsPerUid = 262144;
inline constexpr uint64_t kDefaultMaxWaitsPerUid = 8192;
inline constexpr uint64_t kDefaultMaxWatchersPerUid = 256;
inline constexpr uint64_t kDefaultMaxMetadataBytesPerUid = uint64_t{256} << 20;

enum class UidResource {
  kSessions,
  kTensors,       // tensors a uid produced that the daemon still keeps
  kWaits,         // pending acquires and takes
  kWatchers,
  kMetadataBytes, // names, descriptions, tags, leases, waits and watchers kept for the uid
  // Dedicated host buffers outside namespaces that have an ACL, and the host memory the
  // uid's pending hand-overs hold alive (each tensor once, wherever it lives).
  kHostBytes,
};
inline constexpr size_t kUidResourceCount = 6;

// What an entry costs the daemon besides the strings it keeps (measured roughly: the
// entry, its map nodes, and for a tensor the producer's lease), in kMetadataBytes.
inline constexpr uint64_t kTensorEntryBytes = 512;
inline constexpr uint64_t kTagEntryBytes = 64;
inline constexpr uint64_t kWaitEntryBytes = 256;
inline constexpr uint64_t kWatcherEntryBytes = 256;
inline constexpr uint64_t kLeaseEntryBytes = 96;
// A pending hand-over: its token, table entries and timer. A million tokens on one lease
// measured about 486 bytes each in the daemon's resident memory.
inline constexpr uint64_t kHandOverEntryBytes = 512;

struct UidLimits {
  // Indexed by UidResource; 0 means no limit.
  std::array<uint64_t, kUidResourceCount> limit{};
  uint64_t& operator[](UidResource resource) { return limit[static_cast<size_t>(resource)]; }
  uint64_t operator[](UidResource resource) const { return limit[static_cast<size_t>(resource)]; }
};

class UidQuota {
 public:
  UidQuota(UidLimits limits, std::vector<uid_t> exempt_uids);

  // Adds `amount` to `uid`'s use of `resource`, or fails with nothing changed when that
  // would pass the limit. `what` says what needed it ("allocating a tensor").
  absl::Status Reserve(uid_t uid, UidResource resource, uint64_t amount, std::string_view what);
  // What Reserve would answer, reserving nothing.
  absl::Status CheckRoom(uid_t uid, UidResource resource, uint64_t amount, std::string_view what) const;
  // Adds without a check: for a use that CheckRoom allowed just before, under the same lock
  // (the uid may then pass its limit by what was charged in between, never by more).
  void Add(uid_t uid, UidResource resource, uint64_t amount);
  void Release(uid_t uid, UidResource resource, uint64_t amount);

  uint64_t InUse(uid_t uid, UidResource resource) const;
  uint64_t Limit(UidResource resource) const { return limits_[resource]; }
  bool Exempt(uid_t uid) const;
  // Uids that hold anything.
  size_t uid_count() const { return use_.size(); }

  // The flag that sets a resource's limit, for messages and docs.
  static std::string_view FlagName(UidResource resource);

 private:
  using Use = std::array<uint64_t, kUidResourceCount>;

  const UidLimits limits_;
  const std::vector<uid_t> exempt_uids_;
  absl::flat_hash_map<uid_t, Use> use_;
};

}  // namespace tensord::server
