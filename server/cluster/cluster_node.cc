#include "server/cluster/cluster_node.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/names.h"
#include "grpcpp/server_builder.h"
#include "server/runtime/random_token.h"
#include "server/state/watcher_set.h"
#include "spdlog/spdlog.h"

namespace tensord::server::cluster {

namespace v1 = tensord::v1;
namespace cv1 = tensord::cluster::v1;

namespace {

// HOST:PORT (or [V6]:PORT) that other nodes can reach: not a wildcard, a real port.
absl::Status CheckListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  uint32_t port = 0;
  const std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--cluster-listen ", common::QuoteForError(listen),
                                                   ": give HOST:PORT, e.g. 10.0.0.5:7411"));
  }
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "*") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster-listen ", common::QuoteForError(listen),
        ": name the address other nodes reach this one at (it goes in the directory), not a wildcard"));
  }
  return absl::OkStatus();
}

}  // namespace

// The broker's events for the shared namespaces, handled in order off the broker's threads.
// A task holds the node, never this sink: the broker may drop the sink (RemoveWatcher)
// while its tasks wait; the node outlives them (Stop drains events_).
class ClusterNode::BoundNames final : public WatchSink {
 public:
  explicit BoundNames(ClusterNode& node) : node_(node) {}
  bool Push(const v1::WatchEvent& event) override {
    node_.events_->Post([node = &node_, event] {
      if (event.kind() == v1::WatchEvent::KIND_BOUND) node->OnBound(event);
      if (event.kind() == v1::WatchEvent::KIND_UNBOUND) node->OnUnbound(event);
    });
    return true;
  }
  void Close() override {}

 private:
  ClusterNode& node_;
};

absl::StatusOr<std::unique_ptr<ClusterNode>> ClusterNode::Start(Broker& broker, ClusterOptions options) {
  std::unique_ptr<ClusterNode> node(new ClusterNode(broker, std::move(options)));
  if (absl::Status started = node->Init(); !started.ok()) return started;
  return node;
}

absl::Status ClusterNode::Init() {
  if (options_.etcd_endpoints.empty()) return absl::InvalidArgumentError("cluster: no etcd endpoint");
  if (options_.node.empty()) return absl::InvalidArgumentError("cluster: --node-name is empty");
  if (options_.node.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--node-name ", common::QuoteForError(options_.node),
                                                   ": a node name has no '/'"));
  }
  if (options_.namespaces.empty()) {
    return absl::InvalidArgumentError(
        "cluster: --cluster-namespaces is empty; name the namespaces shared across nodes (every other name "
        "stays on its node)");
  }
  for (const std::string& ns : options_.namespaces) {
    if (absl::Status valid = common::ValidateNamespace(ns); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cluster-namespaces: ", valid.message()));
    }
  }
  if (absl::Status listen = CheckListen(options_.listen); !listen.ok()) return listen;
  absl::StatusOr<PeerCredentials> credentials = LoadPeerCredentials(options_.tls);
  if (!credentials.ok()) return credentials.status();
  absl::StatusOr<std::string> incarnation = NewRandomToken(8, "this node's incarnation");
  if (!incarnation.ok()) return incarnation.status();

  EtcdOptions etcd;
  etcd.endpoints = options_.etcd_endpoints;
  etcd.ca_file = options_.tls.ca_file;
  etcd.cert_file = options_.tls.cert_file;
  etcd.key_file = options_.tls.key_file;
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(etcd);
  if (!client.ok()) return client.status();
  etcd_ = *std::move(client);

  absl::StatusOr<std::unique_ptr<UcxWorker>> ucx = UcxWorker::Start();
  if (!ucx.ok()) return ucx.status();
  ucx_ = *std::move(ucx);
  absl::StatusOr<std::unique_ptr<BrokerSession>> session = BrokerSession::Open(broker_, "tensord-cluster");
  if (!session.ok()) return session.status();
  session_ = *std::move(session);

  DropInheritedReplicas();

  stager_ = std::make_unique<DeviceStager>(options_.stage_helper);
  peer_ = std::make_unique<PeerService>(*session_, *ucx_, *stager_);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, credentials->server, &port);
  builder.RegisterService(peer_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cluster: cannot listen for other brokers on ", options_.listen));
  }

  ReplicaPuller::Options pull;
  pull.node = options_.node;
  pull.incarnation = *incarnation;
  pull.credentials = credentials->channel;
  pull.peer_name = options_.peer_name;
  puller_ = std::make_unique<ReplicaPuller>(*session_, *ucx_, *etcd_, *stager_, pull);
  events_ = std::make_unique<Executor>(1);

  DirectoryOptions where;
  where.node = options_.node;
  where.broker_address = options_.listen;
  where.version = options_.version;
  where.incarnation = *incarnation;
  where.lease_ttl = options_.lease_ttl;
  DirectoryEvents events;
  events.name_recorded = [this](const std::string& name, const cv1::NameRecord& record,
                                std::optional<uint64_t> superseded) { OnNameRecorded(name, record, superseded); };
  events.name_removed = [this](const std::string& name) { OnNameRemoved(name); };
  events.node_left = [this](const std::string& node, const std::string& incarnation) {
    spdlog::info("cluster: node {} left the directory", node);
    peer_->DropReadsOf(node, incarnation);
    puller_->ForgetNode(node);
  };
  events.resynced = [this](const std::map<std::string, cv1::NameRecord>& names) { OnResynced(names); };
  directory_ = Directory::Start(*etcd_, where, std::move(events));

  auto sink = std::make_shared<BoundNames>(*this);
  for (const std::string& ns : options_.namespaces) {
    v1::WatchRequest request;
    request.set_prefix(ns + "/");
    request.set_initial(true);
    absl::StatusOr<uint64_t> watcher = broker_.AddWatcher(session_->id(), request, sink);
    if (!watcher.ok()) return watcher.status();
    watchers_.push_back(*watcher);
    while (broker_.SendInitialBindings(*watcher)) {
    }
  }
  broker_.ShareNamesThrough(this);
  maintenance_ = std::thread([this] { Maintain(); });
  spdlog::info("cluster: node {} serves other brokers on {} ({}); shares namespaces {}; directory on etcd {}",
               options_.node, options_.listen, options_.tls.ca_file.empty() ? "plaintext" : "mutual TLS",
               absl::StrJoin(options_.namespaces, ", "), absl::StrJoin(options_.etcd_endpoints, ","));
  return absl::OkStatus();
}

ClusterNode::~ClusterNode() { Stop(); }

void ClusterNode::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = stopping_ = true;
  }
  wake_.notify_all();
  if (maintenance_.joinable()) maintenance_.join();
  broker_.ShareNamesThrough(nullptr);
  for (uint64_t watcher : watchers_) broker_.RemoveWatcher(watcher);
  if (events_ != nullptr) events_->Shutdown();
  directory_.reset();  // this node's names leave the directory; no directory event comes after
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_.reset();  // before the service it served
  puller_.reset();  // pulls under way finish (they ask etcd_ alone)
  peer_.reset();
  stager_.reset();  // after both users: the helper ends
  session_.reset();
  ucx_.reset();
  etcd_.reset();
}

void ClusterNode::DropInheritedReplicas() {
  size_t dropped = 0;
  for (const std::string& ns : options_.namespaces) {
    absl::StatusOr<std::vector<v1::TensorInfo>> bound = session_->List(ns + "/");
    if (!bound.ok()) {
      spdlog::warn("cluster: {}; replicas bound before this node started stay", std::string(bound.status().message()));
      continue;
    }
    for (const v1::TensorInfo& tensor : *bound) {
      if (tensor.tags().count(kReplicaNodeTag) == 0) continue;
      if (session_->Delete(tensor.name(), tensor.generation()).ok()) ++dropped;
    }
  }
  if (dropped > 0) spdlog::info("cluster: unbound {} replicas bound before this node started", dropped);
}

void ClusterNode::Describe(v1::ClusterStatus& status) const {
  status.set_node(options_.node);
  status.set_listen(options_.listen);
  for (const std::string& ns : options_.namespaces) status.add_namespaces(ns);
  // Stop() sets stopping_ under the lock before it takes any part apart.
  std::lock_guard lock(mu_);
  if (stopping_) return;
  status.set_etcd_endpoint(etcd_->current_endpoint());
  status.set_joined(directory_->connected());
  status.set_names_recorded(directory_->recorded_names());
  const ReplicaPuller::Counts pulled = puller_->counts();
  status.set_replicas(pulled.replicas);
  status.set_pulls(pulled.pulls);
  status.set_bytes_pulled(pulled.bytes_pulled);
  status.set_pulls_failed(pulled.pulls_failed);
  const PeerService::Counts served = peer_->counts();
  status.set_reads_open(served.reads_open);
  status.set_reads_served(served.reads_served);
  status.set_bytes_served(served.bytes_served);
  status.set_device_copies(stager_->copies());
}

bool ClusterNode::Shares(std::string_view name) const {
  const std::string_view ns = common::NamespaceOf(name);
  return std::find(options_.namespaces.begin(), options_.namespaces.end(), ns) != options_.namespaces.end();
}

bool ClusterNode::AnswerIfLeaving(FetchDone& done) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) return false;
  }
  std::move(done)(absl::UnavailableError("cluster: this node is leaving the cluster"));
  return true;
}

void ClusterNode::Fetch(const std::string& name, FetchDone done) {
  if (!AnswerIfLeaving(done)) puller_->Pull(name, std::move(done));
}

void ClusterNode::FetchTake(const std::string& name_or_prefix, FetchDone done) {
  if (!AnswerIfLeaving(done)) puller_->Take(name_or_prefix, std::move(done));
}

void ClusterNode::OnBound(const v1::WatchEvent& event) {
  const v1::TensorInfo& tensor = event.tensor();
  if (puller_->IsReplica(tensor.tensor_id())) return;
  puller_->Forget(event.name());  // a local publish replaced a replica, if one was bound
  cv1::NameRecord record;
  record.set_tensor_id(tensor.tensor_id());
  record.set_generation(event.generation());
  *record.mutable_desc() = tensor.desc();
  record.set_published_unix_ms(absl::ToUnixMillis(absl::Now()));
  directory_->Record(event.name(), std::move(record));
}

void ClusterNode::OnUnbound(const v1::WatchEvent& event) {
  if (std::optional<Replica> replica = puller_->ReplicaOf(event.name());
      replica && replica->generation == event.generation()) {
    puller_->Forget(event.name());
    return;
  }
  directory_->Withdraw(event.name(), event.generation());
}

void ClusterNode::OnNameRecorded(const std::string& name, const cv1::NameRecord& record,
                                 std::optional<uint64_t> superseded) {
  if (superseded) {
    // Published later on another node: the name is that node's everywhere now, as a local
    // publish replaces a binding. Leases on this node's tensor stay.
    (void)session_->Delete(name, *superseded);
  }
  std::optional<Replica> replica = puller_->ReplicaOf(name);
  if (replica && !(replica->node == record.node() && replica->owner_generation == record.generation())) {
    DropReplica(name, "a newer publish on another node");
  }
  switch (broker_.Wants(name, session_->id())) {
    case Broker::Want::kNothing: break;
    case Broker::Want::kReplica:
      puller_->Pull(name, [name](absl::Status pulled) {
        if (!pulled.ok()) spdlog::warn("cluster: pull {} for this node's waits and watches: {}", name, pulled.ToString());
      });
      break;
    case Broker::Want::kTake:
      puller_->Take(name, [name](absl::Status moved) {
        if (!moved.ok() && moved.code() != absl::StatusCode::kNotFound) {
          spdlog::warn("cluster: take {} for the takes waiting here: {}", name, moved.ToString());
        }
      });
      break;
  }
}

void ClusterNode::OnNameRemoved(const std::string& name) { DropReplica(name, "its name left the directory"); }

void ClusterNode::OnResynced(const std::map<std::string, cv1::NameRecord>& names) {
  for (const auto& [name, replica] : puller_->Replicas()) {
    auto it = names.find(name);
    if (it == names.end()) {
      DropReplica(name, "its name left the directory");
    } else if (it->second.node() != replica.node || it->second.generation() != replica.owner_generation) {
      DropReplica(name, "a newer publish on another node");
    }
  }
}

void ClusterNode::DropReplica(const std::string& name, const char* why) {
  std::optional<Replica> replica = puller_->ReplicaOf(name);
  if (!replica) return;
  puller_->Forget(name);
  if (replica->generation == 0) return;  // not bound yet: the puller checks after binding
  if (absl::Status deleted = session_->Delete(name, replica->generation); deleted.ok()) {
    spdlog::debug("cluster: replica of {} (from node {}) unbound: {}", name, replica->node, why);
  }
}

void ClusterNode::Maintain() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    peer_->ExpireReads();
    lock.lock();
  }
}

}  // namespace tensord::server::cluster
