// EtcdClient: the cluster directory's link to etcd, over etcd's own v3 gRPC API
// (proto/etcd/, a subset with etcd's names and field numbers) and the gRPC the daemon
// already links: no etcd client library. Keys and values are bytes; every call has a
// deadline (EtcdOptions::call_timeout) and fails with a status that names the endpoints and
// the key, UNAVAILABLE or DEADLINE_EXCEEDED when etcd cannot be reached. Thread-safe: gRPC
// stubs may be used from any thread.
//
// What the directory needs of etcd, and nothing more yet: reads of a key or a prefix, puts
// (optionally under a lease, so they go when the lease does), a put only where the key is
// absent and a delete only at a known revision (transactions: a name recorded once, a work
// item taken once across nodes), compaction, and leases. EtcdLeaseKeeper keeps a lease
// alive; EtcdWatch follows a prefix.
//
// Endpoints are all http:// or all https://. Over https the client checks etcd's
// certificate against ca_file and, with cert_file and key_file, shows its own (etcd run
// with --client-cert-auth refuses a client without one signed by its trusted CA).
//
// Several endpoints are members of one etcd cluster. Calls go to one member, the current
// one, until a call to it gets no answer (UNAVAILABLE, which is also etcd's "no leader",
// or DEADLINE_EXCEEDED); from then on they go to the next member. Calls that may safely run
// twice (reads, puts, deletes, lease grants and revokes) are tried on the next member at
// once when one is unreachable; transactions are not (a put-if-absent or a
// delete-at-revision sent again could report the other side of its own first success), so
// their callers see the error and try again later. Watches and keep-alives follow the
// current member the same way (channel(), Unanswered()).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"

namespace tensord::server::cluster {

struct EtcdOptions {
  // "http://host:port" or "https://host:port", one per member of the etcd cluster (a DNS
  // name with an address per member also works: gRPC tries the addresses in turn).
  std::vector<std::string> endpoints;
  absl::Duration call_timeout = absl::Seconds(5);
  // PEM files, for https endpoints: the CA that signed etcd's certificate (required), and
  // this node's certificate and key (both or neither).
  std::string ca_file{};
  std::string cert_file{};
  std::string key_file{};
};

// One key as etcd holds it.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// The keys under a prefix, read at one revision of the store.
struct EtcdRange {
  std::vector<EtcdKeyValue> kvs;
  int64_t revision = 0;
};

struct EtcdLeaseGrant {
  int64_t id = 0;
  absl::Duration ttl;
};

class EtcdClient {
 public:
  // Checks the endpoints and makes the channel; connects lazily (the first call does), so
  // an etcd that is down now makes calls fail, not this.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // nullopt: no such key.
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(std::string_view key);
  // Every key that starts with prefix, in key order (prefix must not be empty).
  absl::StatusOr<EtcdRange> GetPrefix(std::string_view prefix);
  // Returns the store's revision after the put. lease 0: none.
  absl::StatusOr<int64_t> Put(std::string_view key, std::string_view value, int64_t lease = 0);
  // Puts only where the key does not exist; false (and nothing written) where it does.
  absl::StatusOr<bool> PutIfAbsent(std::string_view key, std::string_view value, int64_t lease = 0);
  // Deletes the key only if it was last changed at mod_revision; returns what was deleted,
  // or nullopt where the key is gone or changed since. Of several callers racing with the
  // same revision exactly one gets the key.
  absl::StatusOr<std::optional<EtcdKeyValue>> DeleteIfRevision(std::string_view key, int64_t mod_revision);
  // Returns how many keys were deleted (0 or 1).
  absl::StatusOr<int64_t> Delete(std::string_view key);
  absl::StatusOr<int64_t> DeletePrefix(std::string_view prefix);

  // Drops the store's history before revision (etcd keeps every revision until told).
  absl::Status Compact(int64_t revision);

  // A lease of at least ttl (whole seconds, at least 1 s): keys put under it are deleted
  // when it expires, that is, when no keep-alive (EtcdLeaseKeeper) reaches etcd for ttl.
  absl::StatusOr<EtcdLeaseGrant> GrantLease(absl::Duration ttl);
  // Ends the lease now, deleting its keys. A lease that is already gone is not an error.
  absl::Status RevokeLease(int64_t id);

  // The channel to the member that calls go to now (streams open theirs on it).
  std::shared_ptr<grpc::Channel> channel() const;
  // A call on `channel` got no answer: later calls go to the next member, unless another
  // caller moved on from that member already. Nothing changes with one endpoint.
  void Unanswered(const grpc::Channel* channel);
  // Whether a call that ended with `status` got no answer from its member.
  static bool NoAnswer(const grpc::Status& status);
  // The endpoint calls go to now.
  const std::string& current_endpoint() const;
  const EtcdOptions& options() const { return options_; }
  // "etcd at http://a:2379,http://b:2379": how errors name it.
  const std::string& description() const { return description_; }
  // A context with this client's deadline.
  std::unique_ptr<grpc::ClientContext> NewContext() const;

 private:
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  };
  enum class Retry { kOnNextMember, kNo };

  EtcdClient(EtcdOptions options, std::vector<Member> members);
  // Runs call(member, context) on the current member, and on the next ones as `retry` and
  // NoAnswer allow; returns the last call's status.
  template <typename Call>
  grpc::Status OnMember(Retry retry, Call&& call);

  EtcdOptions options_;
  std::string description_;
  std::vector<Member> members_;
  std::atomic<size_t> current_{0};
};

// etcd's wire form of a key, as EtcdKeyValue (for reads and watch events alike).
EtcdKeyValue ToEtcdKeyValue(const mvccpb::KeyValue& kv);

// The end of the range of every key that starts with prefix: prefix with its last byte
// below 0xff incremented (etcd's rule for a prefix range).
std::string PrefixRangeEnd(std::string_view prefix);

}  // namespace tensord::server::cluster
