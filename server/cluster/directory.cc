#include "server/cluster/directory.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace tensord::server::cluster {

namespace cv1 = tensord::cluster::v1;

namespace {

constexpr char kRoot[] = "/tensord/v1/";
constexpr char kNames[] = "/tensord/v1/names/";
constexpr char kNodes[] = "/tensord/v1/nodes/";

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json);
  return json;
}

template <typename Record>
absl::StatusOr<Record> ParseJson(const EtcdKeyValue& kv, const char* what) {
  Record record;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // a newer node may record more
  if (!google::protobuf::util::JsonStringToMessage(kv.value, &record, options).ok()) {
    return absl::DataLossError(absl::StrCat("etcd key ", kv.key, ": not a tensord ", what));
  }
  return record;
}

absl::StatusOr<cv1::NameRecord> ParseRecord(const EtcdKeyValue& kv) {
  return ParseJson<cv1::NameRecord>(kv, "name record");
}

// A directory that did not answer, however etcd failed: the cluster is unavailable to this
// call; node-local work is not.
absl::Status Unreachable(const absl::Status& why) {
  return absl::UnavailableError(absl::StrCat("the cluster directory: ", why.message()));
}

}  // namespace

std::string NameKey(std::string_view name) { return absl::StrCat(kNames, absl::string_view(name.data(), name.size())); }
std::string NodeKey(std::string_view node) { return absl::StrCat(kNodes, absl::string_view(node.data(), node.size())); }

std::unique_ptr<Directory> Directory::Start(EtcdClient& etcd, DirectoryOptions options, DirectoryEvents events) {
  std::unique_ptr<Directory> directory(new Directory(etcd, std::move(options), std::move(events)));
  directory->thread_ = std::thread([d = directory.get()] { d->Run(); });
  return directory;
}

Directory::Directory(EtcdClient& etcd, DirectoryOptions options, DirectoryEvents events)
    : etcd_(etcd), options_(std::move(options)), events_(std::move(events)) {}

Directory::~Directory() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  Disconnect();  // revokes the lease: this node's names leave the directory now
}

bool Directory::connected() const {
  std::lock_guard lock(mu_);
  return lease_ != 0;
}

size_t Directory::recorded_names() const {
  std::lock_guard lock(mu_);
  if (lease_ == 0) return 0;
  return std::count_if(own_.begin(), own_.end(), [](const auto& entry) { return entry.second.revision != 0; });
}

void Directory::Record(const std::string& name, cv1::NameRecord record) {
  record.set_node(options_.node);
  record.set_broker_address(options_.broker_address);
  {
    std::lock_guard lock(mu_);
    own_[name] = Own{std::move(record), 0};
    tasks_.push_back([this, name] {
      Own own;
      {
        std::lock_guard lock(mu_);
        auto it = own_.find(name);
        if (it == own_.end() || lease_ == 0) return;  // withdrawn since, or Connect puts it
        own = it->second;
      }
      PutOwn(name, own, /*if_absent=*/false);
    });
  }
  wake_.notify_all();
}

void Directory::Withdraw(const std::string& name, uint64_t generation) {
  {
    std::lock_guard lock(mu_);
    auto it = own_.find(name);
    if (it == own_.end() || it->second.record.generation() != generation) return;
    own_.erase(it);
    tasks_.push_back([this, name] {
      // The put may still be queued or in flight: delete what this node recorded, at the
      // revision it has now, and nothing another node recorded since.
      absl::StatusOr<std::optional<EtcdKeyValue>> current = etcd_.Get(NameKey(name));
      if (!current.ok()) {
        spdlog::warn("cluster: withdraw {}: {}; it leaves the directory with this node's lease",
                     name, std::string(current.status().message()));
        return;
      }
      if (!current->has_value()) return;
      absl::StatusOr<cv1::NameRecord> record = ParseRecord(**current);
      {
        std::lock_guard lock(mu_);
        if (own_.count(name) != 0) return;  // recorded again meanwhile
      }
      if (!record.ok() || record->node() != options_.node) return;
      (void)etcd_.DeleteIfRevision(NameKey(name), (*current)->mod_revision);
    });
  }
  wake_.notify_all();
}

absl::StatusOr<cv1::NameRecord> LookUpName(EtcdClient& etcd, const std::string& name) {
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = etcd.Get(NameKey(name));
  if (!kv.ok()) return Unreachable(kv.status());
  if (!kv->has_value()) {
    return absl::NotFoundError(absl::StrCat("no node of the cluster has published ", common::QuoteForError(name)));
  }
  return ParseRecord(**kv);
}

absl::StatusOr<std::vector<ListedName>> ListNames(EtcdClient& etcd, const std::string& self,
                                                  const std::string& prefix) {
  absl::StatusOr<EtcdRange> range = etcd.GetPrefix(NameKey(prefix));
  if (!range.ok()) return Unreachable(range.status());
  std::vector<std::pair<int64_t, ListedName>> found;
  for (const EtcdKeyValue& kv : range->kvs) {
    absl::StatusOr<cv1::NameRecord> record = ParseRecord(kv);
    if (!record.ok() || record->node() == self) continue;
    found.push_back({kv.mod_revision, ListedName{kv.key.substr(sizeof(kNames) - 1), *std::move(record)}});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ListedName> listed;
  for (auto& [revision, entry] : found) listed.push_back(std::move(entry));
  return listed;
}

void Directory::PutOwn(const std::string& name, Own& own, bool if_absent) {
  int64_t lease = 0;
  {
    std::lock_guard lock(mu_);
    lease = lease_;
  }
  const std::string value = ToJson(own.record);
  int64_t revision = 0;
  if (if_absent) {
    absl::StatusOr<bool> put = etcd_.PutIfAbsent(NameKey(name), value, lease);
    absl::StatusOr<std::optional<EtcdKeyValue>> kv =
        put.ok() && *put ? etcd_.Get(NameKey(name)) : absl::StatusOr<std::optional<EtcdKeyValue>>(std::nullopt);
    if (put.ok() && !*put) {
      spdlog::info("cluster: {} was published by another node meanwhile; it is that node's now", name);
      std::lock_guard lock(mu_);
      auto it = own_.find(name);
      if (it != own_.end() && it->second.record.tensor_id() == own.record.tensor_id()) own_.erase(it);
      return;
    }
    if (kv.ok() && kv->has_value()) revision = (*kv)->mod_revision;
  } else {
    absl::StatusOr<int64_t> put = etcd_.Put(NameKey(name), value, lease);
    if (!put.ok()) {
      spdlog::warn("cluster: record {}: {}; recorded again once etcd answers", name,
                   std::string(put.status().message()));
      std::lock_guard lock(mu_);
      reconnect_ = true;
      return;
    }
    revision = *put;
  }
  std::lock_guard lock(mu_);
  auto it = own_.find(name);
  if (it != own_.end() && it->second.record.tensor_id() == own.record.tensor_id()) it->second.revision = revision;
}

absl::Status Directory::Connect() {
  std::unique_ptr<EtcdLeaseKeeper> keeper;
  {
    absl::StatusOr<std::unique_ptr<EtcdLeaseKeeper>> started =
        EtcdLeaseKeeper::Start(etcd_, options_.lease_ttl, [this](absl::Status why) {
          spdlog::warn("cluster: this node's etcd lease is lost ({}); its names leave the directory until "
                       "etcd answers again",
                       std::string(why.message()));
          {
            std::lock_guard lock(mu_);
            reconnect_ = true;
            lease_ = 0;
          }
          wake_.notify_all();
        });
    if (!started.ok()) return started.status();
    keeper = *std::move(started);
  }
  cv1::NodeRecord node;
  node.set_node(options_.node);
  node.set_broker_address(options_.broker_address);
  node.set_version(options_.version);
  node.set_started_unix_ms(absl::ToUnixMillis(absl::Now()));
  node.set_incarnation(options_.incarnation);
  if (absl::StatusOr<int64_t> put = etcd_.Put(NodeKey(options_.node), ToJson(node), keeper->id()); !put.ok()) {
    return put.status();
  }
  absl::StatusOr<EtcdRange> all = etcd_.GetPrefix(kRoot);
  if (!all.ok()) return all.status();
  {
    std::lock_guard lock(mu_);
    lease_ = keeper->id();
  }
  keeper_ = std::move(keeper);
  // This node's names, again where no other node has taken them.
  std::map<std::string, Own> own;
  {
    std::lock_guard lock(mu_);
    own = own_;
  }
  std::map<std::string, cv1::NameRecord> others;
  for (const EtcdKeyValue& kv : all->kvs) {
    if (!absl::StartsWith(kv.key, kNames)) continue;
    absl::StatusOr<cv1::NameRecord> record = ParseRecord(kv);
    if (!record.ok() || record->node() == options_.node) continue;
    const std::string name = kv.key.substr(sizeof(kNames) - 1);
    others[name] = *record;
  }
  for (auto& [name, entry] : own) {
    if (others.count(name) == 0) PutOwn(name, entry, /*if_absent=*/true);
  }
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, record] : others) own_.erase(name);  // another node's now
  }
  if (events_.resynced) events_.resynced(others);
  watch_ = EtcdWatch::Start(
      etcd_, kRoot, all->revision + 1, [this](std::vector<EtcdEvent> events) { OnEvents(std::move(events)); },
      [this](absl::Status why) {
        spdlog::warn("cluster: the directory's watch ended ({}); reading it again", std::string(why.message()));
        {
          std::lock_guard lock(mu_);
          reconnect_ = true;
        }
        wake_.notify_all();
      });
  spdlog::info("cluster: node {} joined the directory (etcd lease {:x}, TTL {}), {} names of other nodes",
               options_.node, keeper_->id(), absl::FormatDuration(keeper_->ttl()), others.size());
  return absl::OkStatus();
}

void Directory::Disconnect() {
  watch_.reset();
  keeper_.reset();
  std::lock_guard lock(mu_);
  lease_ = 0;
}

void Directory::OnEvents(std::vector<EtcdEvent> events) {
  for (const EtcdEvent& event : events) {
    const std::string& key = event.kv.key;
    if (absl::StartsWith(key, kNodes)) {
      const std::string node = key.substr(sizeof(kNodes) - 1);
      if (event.kind == EtcdEvent::Kind::kDelete && node != options_.node && events_.node_left) {
        absl::StatusOr<cv1::NodeRecord> left =
            event.prev ? ParseJson<cv1::NodeRecord>(*event.prev, "node record") : absl::NotFoundError("no record");
        events_.node_left(node, left.ok() ? left->incarnation() : std::string());
      }
      continue;
    }
    if (!absl::StartsWith(key, kNames)) continue;
    const std::string name = key.substr(sizeof(kNames) - 1);
    if (event.kind == EtcdEvent::Kind::kDelete) {
      {
        std::lock_guard lock(mu_);
        auto it = own_.find(name);
        // Deleted behind this node's back (its lease expired, or by hand): not its any more.
        if (it != own_.end() && it->second.revision != 0 && it->second.revision < event.kv.mod_revision) {
          own_.erase(it);
        }
      }
      if (events_.name_removed) events_.name_removed(name);
      continue;
    }
    absl::StatusOr<cv1::NameRecord> record = ParseRecord(event.kv);
    if (!record.ok()) {
      spdlog::warn("cluster: {}", std::string(record.status().message()));
      continue;
    }
    if (record->node() == options_.node) continue;  // this node's own put
    std::optional<uint64_t> superseded;
    {
      std::lock_guard lock(mu_);
      auto it = own_.find(name);
      // Published since by another node: its now. A put of this node's still to come (or
      // of a later revision) is newer and stays this node's.
      if (it != own_.end() && it->second.revision != 0 && it->second.revision < event.kv.mod_revision) {
        superseded = it->second.record.generation();
        own_.erase(it);
      }
    }
    if (events_.name_recorded) events_.name_recorded(name, *record, superseded);
  }
}

void Directory::Run() {
  bool failing = false;
  for (;;) {
    std::deque<absl::AnyInvocable<void() &&>> tasks;
    bool reconnect = false;
    {
      std::unique_lock lock(mu_);
      const auto ready = [this] { return stopping_ || !tasks_.empty() || reconnect_; };
      if (failing) {
        wake_.wait_for(lock, absl::ToChronoMilliseconds(options_.retry), [this] { return stopping_; });
      } else {
        wake_.wait(lock, ready);
      }
      if (stopping_) return;
      reconnect = reconnect_;
      if (!reconnect) tasks.swap(tasks_);
    }
    if (reconnect) {
      Disconnect();
      absl::Status connected = Connect();
      if (!connected.ok()) {
        Disconnect();
        if (!failing) {
          spdlog::warn("cluster: cannot join the directory on etcd: {}; node-local work goes on, trying again "
                       "every {}",
                       connected.ToString(), absl::FormatDuration(options_.retry));
        }
        failing = true;
        continue;
      }
      failing = false;
      std::lock_guard lock(mu_);
      reconnect_ = false;
      continue;
    }
    for (auto& task : tasks) std::move(task)();
  }
}

}  // namespace tensord::server::cluster
