// UsageCounters: running figures of what the registry holds, kept as tensors and leases
// come and go, so that Status and the metrics page cost O(namespaces + sessions) however
// many tensors there are: per namespace and device, the tensors and their bytes; per
// session, the tensors it produced that the broker still keeps, their bytes, and the bytes
// of the distinct tensors it holds leases on.
//
// TensorRegistry owns one and is its only writer: each change of a tensor's namespace,
// layout or holders goes through the registry, which tells its counters once, so they
// cannot drift from a recount (TensorRegistry::RecountUsageForTest checks that). A row or
// session entry goes once it counts nothing. Removing what was not added is a broken
// invariant and crashes.
//
// A tensor's bytes are its own (TensorLayout::nbytes), as Status has always reported them.
// Not thread-safe: the Broker guards the registry, and this with it, by its mutex.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace tensord::server {

struct ResolvedDevice;

class UsageCounters {
 public:
  // A namespace row: tensors of one namespace on one device. Tensors with no namespace yet
  // are readable by their producer's uid (AccessPolicy::MayReadIn), so their rows are kept
  // per producer uid; `producer_uid` is 0 in every other row.
  struct NamespaceKey {
    std::string ns;
    const ResolvedDevice* device = nullptr;  // null: a zero-byte tensor with no device (host)
    uid_t producer_uid = 0;
    bool operator==(const NamespaceKey&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const NamespaceKey& key) {
      return H::combine(std::move(h), key.ns, key.device, key.producer_uid);
    }
  };
  struct Figures {
    uint64_t tensors = 0, bytes = 0;
    bool operator==(const Figures&) const = default;
  };
  struct SessionFigures {
    uint64_t tensors_produced = 0, bytes_produced = 0;
    uint64_t bytes_leased = 0;  // each tensor once, however many leases the session holds on it
    bool operator==(const SessionFigures&) const = default;
  };

  // What one tensor adds: its namespace row, and its producer session's figures (a session
  // id of 0, a tensor carried from another daemon, counts in no session).
  void AddTensor(std::string_view ns, const ResolvedDevice* device, uid_t producer_uid, uint64_t producer_session,
                 uint64_t bytes);
  void RemoveTensor(std::string_view ns, const ResolvedDevice* device, uid_t producer_uid,
                    uint64_t producer_session, uint64_t bytes);
  // A session came to hold its first lease on a tensor of `bytes` / let go of its last.
  void AddHolder(uint64_t session_id, uint64_t bytes);
  void RemoveHolder(uint64_t session_id, uint64_t bytes);

  const absl::flat_hash_map<NamespaceKey, Figures>& namespaces() const { return namespaces_; }
  // Zeroes for a session that produced and holds nothing.
  SessionFigures ForSession(uint64_t session_id) const;

  bool operator==(const UsageCounters&) const = default;

 private:
  static NamespaceKey KeyOf(std::string_view ns, const ResolvedDevice* device, uid_t producer_uid);
  void DropSessionIfEmpty(uint64_t session_id);

  absl::flat_hash_map<NamespaceKey, Figures> namespaces_;
  absl::flat_hash_map<uint64_t, SessionFigures> sessions_;
};

}  // namespace tensord::server
