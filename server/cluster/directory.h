// Directory: this node's part of the cluster directory on etcd. Keys (values are JSON of
// tensord.cluster.v1 records, readable with etcdctl):
//   /tensord/v1/nodes/<node>   NodeRecord: a broker of the cluster and where it serves peers
//   /tensord/v1/names/<name>   NameRecord: which node holds the tensor of a shared name
// Both under this node's etcd lease (EtcdLeaseKeeper), so a node that dies or is cut off
// leaves the directory within the lease's TTL. A shared name has one owner at a time: the
// node that published it last (its put is the newest).
//
// Start() returns at once; a thread of the directory connects (grants the lease, records
// the node, reads the names, follows them with a watch) and, while etcd cannot be reached,
// tries again every second: node-local work never waits for etcd. When the lease is lost
// (etcd unreachable for a whole TTL, or etcd restarted without its data), the directory
// connects again and records this node's names once more, except those another node has
// taken meanwhile.
//
// Record and Withdraw never block (the broker calls them on its threads): the puts run on
// the directory's thread, in order. LookUpName and ListNames ask etcd and wait for it (at
// most one call's deadline). The event callbacks run on the watch's thread, one at a time, for every
// other node's change (this node's own puts are not reported); they must not block for long.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/cluster/etcd_client.h"
#include "server/cluster/etcd_lease_keeper.h"
#include "server/cluster/etcd_watch.h"
#include "tensord/cluster/v1/cluster.pb.h"

namespace tensord::server::cluster {

struct DirectoryOptions {
  std::string node;            // this node's name
  std::string broker_address;  // where this node serves peers (HOST:PORT)
  std::string version;
  std::string incarnation;     // this run of the node (NodeRecord.incarnation)
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration retry = absl::Seconds(1);
};

struct DirectoryEvents {
  // Another node recorded `name` (published it, or published it again). `superseded`: the
  // generation of this node's own binding of the name that the newer publish replaces.
  absl::AnyInvocable<void(const std::string& name, const tensord::cluster::v1::NameRecord& record,
                          std::optional<uint64_t> superseded)>
      name_recorded;
  // `name` left the directory (its owner unbound it, or the owner's lease expired).
  absl::AnyInvocable<void(const std::string& name)> name_removed;
  // Another node left the directory (its lease expired or it stopped): the run of it that
  // `incarnation` names (empty where etcd no longer had its record).
  absl::AnyInvocable<void(const std::string& node, const std::string& incarnation)> node_left;
  // The directory was read whole (after connecting again, changes may have been missed):
  // every name another node holds now, by name.
  absl::AnyInvocable<void(const std::map<std::string, tensord::cluster::v1::NameRecord>& names)> resynced;
};

// Where a key lives.
std::string NameKey(std::string_view name);
std::string NodeKey(std::string_view node);

// A name's record as etcd holds it now: NOT_FOUND when no node has it, UNAVAILABLE ("the
// cluster directory: " and etcd's error) when etcd does not answer in time. Needs only
// the client, so it serves pulls that outlive a Directory.
absl::StatusOr<tensord::cluster::v1::NameRecord> LookUpName(EtcdClient& etcd, const std::string& name);
// The names nodes other than `self` recorded under `prefix` (ending in '/'), oldest
// publish first.
struct ListedName {
  std::string name;
  tensord::cluster::v1::NameRecord record;
};
absl::StatusOr<std::vector<ListedName>> ListNames(EtcdClient& etcd, const std::string& self,
                                                  const std::string& prefix);

class Directory {
 public:
  static std::unique_ptr<Directory> Start(EtcdClient& etcd, DirectoryOptions options, DirectoryEvents events);
  ~Directory();
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  // This node published `name` (record.node and broker_address are filled in here).
  void Record(const std::string& name, tensord::cluster::v1::NameRecord record);
  // The binding this node recorded under `name` at `generation` was unbound: the key goes,
  // unless another node has recorded the name since, or this node a later generation.
  void Withdraw(const std::string& name, uint64_t generation);
  // Whether this node's lease is held now (its names are in the directory).
  bool connected() const;
  // This node's names recorded in the directory now.
  size_t recorded_names() const;
  const DirectoryOptions& options() const { return options_; }

 private:
  struct Own {
    tensord::cluster::v1::NameRecord record;
    int64_t revision = 0;  // of the put; 0: not in etcd yet
  };
  Directory(EtcdClient& etcd, DirectoryOptions options, DirectoryEvents events);
  void Run();
  // Lease, node record, own names, a read of the names and a watch after it.
  absl::Status Connect();
  void Disconnect();
  // Puts one own name; under a lease of this node.
  void PutOwn(const std::string& name, Own& own, bool if_absent);
  void OnEvents(std::vector<EtcdEvent> events);

  EtcdClient& etcd_;
  const DirectoryOptions options_;
  DirectoryEvents events_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool reconnect_ = true;  // the lease is lost (or never held): connect again
  std::deque<absl::AnyInvocable<void() &&>> tasks_;  // Record, Withdraw: run on the thread
  std::map<std::string, Own> own_;                   // the names this node recorded
  int64_t lease_ = 0;                                // 0: not connected

  // Used on the directory's thread only.
  std::unique_ptr<EtcdLeaseKeeper> keeper_;
  std::unique_ptr<EtcdWatch> watch_;
  std::thread thread_;
};

}  // namespace tensord::server::cluster
