// Two ClusterNodes in one process, each over a Broker of its own, with a real etcd on
// loopback and UCX over TCP on loopback: the cluster's parts together, where the sanitizer
// builds see them (the network-namespace tests of test_cluster_netns.py run the daemons).
#include "server/cluster/cluster_node.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/memory/backends.h"
#include "common/memory/host/memfd.h"
#include "common/unique_fd.h"
#include "gtest/gtest.h"
#include "server/broker/broker.h"
#include "server/cluster/broker_session.h"
#include "server/cluster/peer_service.h"
#include "server/cluster/ucx_worker.h"
#include "server/memory/backend_registry.h"
#include "tests/cluster/etcd_server.h"
#ifdef TENSORD_FAKE_CUDA_PATH
#include "tests/unit/cuda/fake_cuda_env.h"
#endif

namespace tensord::server::cluster {
namespace {

namespace v1 = tensord::v1;
using testing::EtcdServer;

// A loopback port nobody listens on now.
int FreePort() {
  common::UniqueFd fd(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length);
  return ntohs(address.sin_port);
}

// A node: its broker, a client session on it, and the cluster node over it.
struct Node {
  std::unique_ptr<Broker> broker;
  uint64_t session = 0;
  std::unique_ptr<ClusterNode> cluster;
};

class ClusterNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdServer::Binary().empty()) GTEST_SKIP() << "no etcd binary (Debian: etcd-server)";
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    absl::StatusOr<EtcdServer> etcd = EtcdServer::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_.emplace(*std::move(etcd));
    a_ = StartNode("a");
    b_ = StartNode("b");
  }

  void TearDown() override {
    for (Node* node : {&a_, &b_}) {
      node->cluster.reset();
      node->broker.reset();
    }
  }

  Node StartNode(const std::string& name, uint64_t max_host_bytes = 256 << 20) {
    Node node;
    BrokerOptions options;
    options.max_host_bytes = max_host_bytes;
    options.daemon_uid = getuid();
    options.recycle = {16, 256 << 20};  // as the daemon's defaults allow
    node.broker = std::make_unique<Broker>(options, Backends());
    node.session = node.broker->OpenSession({getuid(), getgid(), getpid()}, "test")->session_id();
    JoinCluster(node, name);
    return node;
  }

  // The memory each node's broker serves.
  virtual std::unique_ptr<BackendRegistry> Backends() { return HostOnlyBackends(); }

  // A ClusterNode named `name` over the node's broker.
  void JoinCluster(Node& node, const std::string& name) {
    ClusterOptions cluster;
    cluster.etcd_endpoints = {etcd_->endpoint()};
    cluster.node = name;
    cluster.listen = absl::StrCat("127.0.0.1:", FreePort());
    cluster.namespaces = {"shared"};
    cluster.tls.insecure = true;
    cluster.lease_ttl = absl::Seconds(2);
    cluster.stage_helper = TENSORD_STAGE_HELPER_PATH;
    absl::StatusOr<std::unique_ptr<ClusterNode>> started = ClusterNode::Start(*node.broker, cluster);
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) node.cluster = *std::move(started);
  }

  // An allocation of `count` int32s for `name` on device `type` `ordinal`.
  static v1::AllocateRequest Int32s(const std::string& name, int64_t count, v1::DeviceType type = v1::DEVICE_TYPE_CPU,
                                    int32_t ordinal = 0) {
    v1::AllocateRequest request;
    request.set_ns(name.substr(0, name.find('/')));
    v1::TensorDesc* desc = request.mutable_desc();
    desc->mutable_dtype()->set_code(v1::DTYPE_CODE_INT);
    desc->mutable_dtype()->set_bits(32);
    desc->mutable_dtype()->set_lanes(1);
    desc->add_shape(count);
    desc->mutable_device()->set_type(type);
    desc->mutable_device()->set_index(ordinal);
    return request;
  }

  // Publishes `count` int32s of value `fill` under `name` on `node`.
  static uint64_t Put(Node& node, const std::string& name, int64_t count, int32_t fill) {
    const v1::AllocateRequest request = Int32s(name, count);
    std::promise<absl::StatusOr<v1::AllocateResponse>> allocated;
    node.broker->Allocate(node.session, request, [&](auto r) { allocated.set_value(std::move(r)); });
    absl::StatusOr<v1::AllocateResponse> tensor = allocated.get_future().get();
    EXPECT_TRUE(tensor.ok()) << tensor.status();
    const v1::BufferRef& buffer = tensor->tensor().buffer();
    v1::FetchFd fetch;
    fetch.add_buffer_ids(buffer.buffer_id());
    auto handles = node.broker->FetchHandles(node.session, fetch);
    EXPECT_TRUE(handles.ok());
    const int fd = (*handles)[0].handle.fds[0].get();
    std::vector<int32_t> values(count, fill);
    EXPECT_EQ(pwrite(fd, values.data(), count * 4, buffer.offset()), count * 4);
    EXPECT_TRUE(common::SealFutureWrite(fd, "test").ok());
    v1::PublishRequest publish;
    publish.set_tensor_id(tensor->tensor().tensor_id());
    publish.set_name(name);
    EXPECT_TRUE(node.broker->Publish(node.session, publish).ok());
    v1::ReleaseRequest release;
    release.add_lease_ids(tensor->lease_id());
    EXPECT_TRUE(node.broker->Release(node.session, release).ok());
    return tensor->tensor().tensor_id();
  }

  // An acquire (or take) on `node` and the tensor's first int32, or the error; `buffer_id`:
  // where the tensor was.
  static absl::StatusOr<int32_t> Read(Node& node, const std::string& name, bool take = false,
                                      uint64_t timeout_ms = 0, uint64_t* buffer_id = nullptr) {
    std::promise<absl::StatusOr<v1::AcquireResponse>> answer;
    auto done = [&](absl::StatusOr<v1::AcquireResponse> r) { answer.set_value(std::move(r)); };
    if (take) {
      v1::TakeRequest request;
      request.set_name_or_prefix(name);
      if (timeout_ms > 0) request.set_timeout_ms(timeout_ms);
      node.broker->Take(node.session, request, done);
    } else {
      v1::AcquireRequest request;
      request.set_name(name);
      if (timeout_ms > 0) request.set_timeout_ms(timeout_ms);
      node.broker->Acquire(node.session, request, done);
    }
    absl::StatusOr<v1::AcquireResponse> lease = answer.get_future().get();
    if (!lease.ok()) return lease.status();
    if (buffer_id != nullptr) *buffer_id = lease->tensor().buffer().buffer_id();
    v1::FetchFd fetch;
    fetch.add_buffer_ids(lease->tensor().buffer().buffer_id());
    auto handles = node.broker->FetchHandles(node.session, fetch);
    if (!handles.ok()) return handles.status();
    int32_t first = 0;
    EXPECT_EQ(pread((*handles)[0].handle.fds[0].get(), &first, 4, lease->tensor().buffer().offset()), 4);
    v1::ReleaseRequest release;
    release.add_lease_ids(lease->lease_id());
    (void)node.broker->Release(node.session, release);
    return first;
  }

  // Reads until the answer is `want` (the directory is eventually consistent), up to 10 s;
  // the last error, or one naming the value read instead.
  static absl::StatusOr<int32_t> ReadUntil(Node& node, const std::string& name, int32_t want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    absl::StatusOr<int32_t> got;
    while (absl::Now() < deadline) {
      got = Read(node, name);
      if (got.ok() && *got == want) return got;
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (!got.ok()) return got;
    return absl::FailedPreconditionError(absl::StrCat(name, " still read ", *got, " after 10 s, not ", want));
  }

  std::optional<EtcdServer> etcd_;
  Node a_, b_;
};

TEST_F(ClusterNodeTest, AcquireOnOneNodeWhatAnotherPublished) {
  Put(a_, "shared/w", 1 << 20, 7);
  absl::StatusOr<int32_t> got = ReadUntil(b_, "shared/w", 7);
  ASSERT_TRUE(got.ok()) << got.status();
  // A name outside the shared namespaces never leaves its node.
  Put(a_, "local/w", 16, 1);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(Read(b_, "local/w").status().code(), absl::StatusCode::kNotFound);
  // A publish on a replaces b's replica; one on b takes the name over on a too.
  Put(a_, "shared/w", 1 << 20, 8);
  EXPECT_TRUE(ReadUntil(b_, "shared/w", 8).ok());
  Put(b_, "shared/w", 1024, 9);
  EXPECT_TRUE(ReadUntil(a_, "shared/w", 9).ok());
}

// What each node's status section says after one pull: b pulled it, a served it.
TEST_F(ClusterNodeTest, StatusShowsWhatEachNodePulledAndServed) {
  Put(a_, "shared/counted", 1 << 20, 7);  // 4 MiB
  ASSERT_TRUE(ReadUntil(b_, "shared/counted", 7).ok());
  v1::ClusterStatus a, b;
  // a notes its record, and the end of the read, just after b has the bytes.
  for (const absl::Time deadline = absl::Now() + absl::Seconds(5);; absl::SleepFor(absl::Milliseconds(20))) {
    a.Clear();
    a_.cluster->Describe(a);
    if ((a.names_recorded() == 1 && a.reads_served() == 1) || absl::Now() >= deadline) break;
  }
  b_.cluster->Describe(b);
  EXPECT_EQ(a.node(), "a");
  EXPECT_TRUE(a.joined());
  EXPECT_EQ(a.etcd_endpoint(), etcd_->endpoint());
  EXPECT_EQ(std::vector<std::string>(a.namespaces().begin(), a.namespaces().end()),
            std::vector<std::string>{"shared"});
  EXPECT_EQ(a.names_recorded(), 1u);
  EXPECT_EQ(a.reads_served(), 1u);
  EXPECT_EQ(a.reads_open(), 0u);
  EXPECT_EQ(a.pulls(), 0u);
  EXPECT_EQ(b.names_recorded(), 0u);
  EXPECT_EQ(b.replicas(), 1u);
  EXPECT_EQ(b.pulls(), 1u);
  EXPECT_GE(b.bytes_pulled(), 4u << 20);
  EXPECT_EQ(a.bytes_served(), b.bytes_pulled());
  EXPECT_EQ(b.pulls_failed(), 0u);
  // Once the node has left, only its settings remain.
  a_.cluster->Stop();
  v1::ClusterStatus left;
  a_.cluster->Describe(left);
  EXPECT_EQ(left.node(), "a");
  EXPECT_FALSE(left.joined());
  EXPECT_EQ(left.etcd_endpoint(), "");
}

// A node short of memory gives back the replicas nobody holds, oldest first, and pulls one
// again when it is asked for.
TEST_F(ClusterNodeTest, ReplicasGiveWayWhenTheNodeIsShortOfMemory) {
  b_.cluster.reset();
  b_.broker.reset();
  b_ = StartNode("b", 24 << 20);
  ASSERT_NE(b_.cluster, nullptr);
  Put(a_, "shared/r1", 2 << 20, 1);  // 8 MiB each
  Put(a_, "shared/r2", 2 << 20, 2);
  ASSERT_TRUE(ReadUntil(b_, "shared/r1", 1).ok());
  absl::SleepFor(absl::Milliseconds(5));  // r2's replica is younger
  ASSERT_TRUE(ReadUntil(b_, "shared/r2", 2).ok());
  auto counts = [this] {
    v1::ClusterStatus status;
    b_.cluster->Describe(status);
    return std::pair<uint64_t, uint64_t>(status.replicas(), status.pulls());
  };
  ASSERT_EQ(counts(), std::make_pair(uint64_t{2}, uint64_t{2}));

  // 16 of 24 MiB hold replicas: a local tensor of 16 MiB needs 8 more, and r1 gives way.
  Put(b_, "local/big", 4 << 20, 5);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (counts().first != 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(counts(), std::make_pair(uint64_t{1}, uint64_t{2})) << "r1's replica is forgotten, r2's kept";
  EXPECT_EQ(Read(b_, "shared/r2").value_or(-1), 2);
  EXPECT_EQ(counts().second, 2u) << "r2 was read from its replica, not pulled again";
  // Asked for again, r1 is pulled again (r2's replica, unheld, makes room for it).
  EXPECT_EQ(Read(b_, "shared/r1").value_or(-1), 1);
  EXPECT_EQ(counts().second, 3u);
}

// A broker that kept replicas while its cluster node went (a take-over restart keeps the
// bindings): the next node unbinds them, since nothing tracks them any more, and an acquire
// pulls the name's current tensor.
TEST_F(ClusterNodeTest, ReplicasFromBeforeANodeStartedAreDroppedAndPulledAgain) {
  Put(a_, "shared/kept", 1024, 1);
  ASSERT_TRUE(ReadUntil(b_, "shared/kept", 1).ok());
  b_.cluster.reset();  // b's broker keeps the replica
  EXPECT_EQ(Read(b_, "shared/kept").value_or(-1), 1);
  Put(a_, "shared/kept", 1024, 2);  // b's node is gone: nothing drops b's stale replica
  JoinCluster(b_, "b");
  ASSERT_NE(b_.cluster, nullptr);
  absl::StatusOr<int32_t> got = ReadUntil(b_, "shared/kept", 2);
  EXPECT_TRUE(got.ok()) << got.status() << " (the replica from before the node started was kept)";
}

// A node restarted under the same name may read before the directory reports its earlier
// run gone: the owner ends only the reads of the run that left, never the new run's (whose
// gets would then read memory no longer registered).
TEST_F(ClusterNodeTest, TheOwnerEndsTheReadsOfTheRunOfANodeThatLeftOnly) {
  Put(a_, "shared/read", 1024, 3);
  absl::StatusOr<std::unique_ptr<BrokerSession>> session = BrokerSession::Open(*a_.broker, "peer-test");
  ASSERT_TRUE(session.ok()) << session.status();
  absl::StatusOr<std::unique_ptr<UcxWorker>> ucx = UcxWorker::Start();
  ASSERT_TRUE(ucx.ok()) << ucx.status();
  DeviceStager stager(TENSORD_STAGE_HELPER_PATH);
  PeerService peer(**session, **ucx, stager);
  tensord::cluster::v1::OpenReadRequest open;
  open.set_name("shared/read");
  open.set_reader_node("b");
  open.set_reader_incarnation("second-run");
  tensord::cluster::v1::OpenReadResponse read;
  grpc::Status opened = peer.OpenRead(nullptr, &open, &read);
  ASSERT_TRUE(opened.ok()) << opened.error_message();
  EXPECT_EQ(peer.counts().reads_open, 1u);
  peer.DropReadsOf("b", "first-run");
  EXPECT_EQ(peer.counts().reads_open, 1u) << "the new run's read ended with the old run";
  peer.DropReadsOf("b", "second-run");
  EXPECT_EQ(peer.counts().reads_open, 0u);
  // A node that left without a record to name its run: every read of it ends.
  ASSERT_TRUE(peer.OpenRead(nullptr, &open, &read).ok());
  peer.DropReadsOf("b", "");
  EXPECT_EQ(peer.counts().reads_open, 0u);
}

TEST_F(ClusterNodeTest, NewGenerationsOfANameArePulledIntoTheReplicasBuffer) {
  std::set<uint64_t> buffers;
  for (int32_t generation = 1; generation <= 4; ++generation) {
    Put(a_, "shared/weights", 1 << 20, generation);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    uint64_t buffer = 0;
    absl::StatusOr<int32_t> got;
    do {
      got = Read(b_, "shared/weights", /*take=*/false, /*timeout_ms=*/0, &buffer);
    } while ((!got.ok() || *got != generation) && absl::Now() < deadline);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, generation);
    buffers.insert(buffer);
  }
  // Each replica, released, served the next generation: b allocated memory once or twice
  // (the new replica may be pulled before the old one is unbound), not four times.
  EXPECT_LE(buffers.size(), 2u);
}

TEST_F(ClusterNodeTest, ConcurrentAcquiresAndWaits) {
  Put(a_, "shared/many", 4 << 20, 3);
  ASSERT_TRUE(ReadUntil(b_, "shared/many", 3).ok());
  std::vector<std::future<absl::StatusOr<int32_t>>> reads;
  for (int i = 0; i < 4; ++i) {
    reads.push_back(std::async(std::launch::async, [&, i] {
      const std::string name = absl::StrCat("shared/later/", i % 2);
      return Read(b_, name, /*take=*/false, /*timeout_ms=*/10000);
    }));
  }
  absl::SleepFor(absl::Milliseconds(200));
  Put(a_, "shared/later/0", 1 << 20, 10);
  Put(a_, "shared/later/1", 1 << 20, 11);
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<int32_t> got = reads[i].get();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, 10 + i % 2);
  }
}

TEST_F(ClusterNodeTest, TakesAcrossNodesHandOutEachTensorOnce) {
  constexpr int kItems = 12;
  for (int i = 0; i < kItems; ++i) Put(a_, absl::StrCat("shared/q/", 100 + i), 256, i);
  absl::SleepFor(absl::Milliseconds(300));
  std::vector<std::future<std::vector<int32_t>>> takers;
  for (Node* node : {&a_, &b_, &b_}) {
    takers.push_back(std::async(std::launch::async, [node] {
      std::vector<int32_t> taken;
      for (int misses = 0; misses < 3;) {
        absl::StatusOr<int32_t> got = Read(*node, "shared/q/", /*take=*/true);
        if (got.ok()) {
          taken.push_back(*got);
          misses = 0;
        } else {
          EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
          ++misses;
          absl::SleepFor(absl::Milliseconds(100));
        }
      }
      return taken;
    }));
  }
  std::multiset<int32_t> all;
  for (auto& taker : takers) {
    for (int32_t value : taker.get()) all.insert(value);
  }
  std::multiset<int32_t> expected;
  for (int i = 0; i < kItems; ++i) expected.insert(i);
  EXPECT_EQ(all, expected);
}

TEST_F(ClusterNodeTest, ANodeThatLeavesTakesItsNamesAlong) {
  Put(a_, "shared/gone", 1024, 5);
  ASSERT_TRUE(ReadUntil(b_, "shared/gone", 5).ok());
  a_.cluster.reset();  // leaves: its lease is revoked
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  absl::StatusOr<int32_t> got = Read(b_, "shared/gone");
  while (got.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    got = Read(b_, "shared/gone");
  }
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
}

TEST_F(ClusterNodeTest, EtcdDownFailsClusterCallsOnlyAndTheNodesRejoin) {
  Put(a_, "shared/kept", 1024, 4);
  ASSERT_TRUE(ReadUntil(b_, "shared/kept", 4).ok());
  etcd_->Pause();
  Put(a_, "shared/late", 1024, 6);  // a local publish goes on
  absl::StatusOr<int32_t> local = Read(a_, "shared/late");
  EXPECT_TRUE(local.ok()) << local.status();
  absl::StatusOr<int32_t> remote = Read(b_, "shared/late");
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kUnavailable) << remote.status();
  EXPECT_NE(remote.status().message().find("cluster directory"), std::string::npos) << remote.status();
  etcd_->Resume();
  // a's lease may have lapsed meanwhile: it records its names again.
  absl::StatusOr<int32_t> later = ReadUntil(b_, "shared/late", 6);
  EXPECT_TRUE(later.ok()) << later.status();
}

#ifdef TENSORD_FAKE_CUDA_PATH
// Device tensors across nodes, over the software CUDA stand-in (its two "devices" are host
// memory, shared by both nodes of this process): the owner's staging helper copies the
// tensor to host memory, b reads that, and b's helper copies it to b's device of the same
// ordinal. The plumbing, not the hardware.
class ClusterNodeDeviceTest : public ClusterNodeTest {
 protected:
  std::unique_ptr<BackendRegistry> Backends() override {
    return std::make_unique<BackendRegistry>(common::MakeBackends(), common::MissingBackends());
  }

  static std::unique_ptr<common::ImportedRegion> MapDevice(Node& node, const v1::TensorInfo& tensor) {
    v1::FetchFd fetch;
    fetch.add_buffer_ids(tensor.buffer().buffer_id());
    auto handles = node.broker->FetchHandles(node.session, fetch);
    EXPECT_TRUE(handles.ok()) << handles.status();
    if (!handles.ok()) return nullptr;
    common::FetchedBuffer buffer;
    buffer.size = (*handles)[0].size;
    buffer.device_type = (*handles)[0].device_type;
    buffer.handle = std::move((*handles)[0].handle);
    auto importer = common::ProcessImporters().For(buffer.device_type);
    EXPECT_TRUE(importer.ok());
    auto region = (*importer)->Import(buffer, common::MapMode::kSharedWritable, "test");
    EXPECT_TRUE(region.ok()) << region.status();
    return region.ok() ? *std::move(region) : nullptr;
  }

  // Publishes `count` int32s (i * 3 + fill) on cuda device `ordinal` of `node`.
  static void PutOnDevice(Node& node, const std::string& name, int32_t ordinal, int64_t count, int32_t fill) {
    const v1::AllocateRequest request = Int32s(name, count, v1::DEVICE_TYPE_CUDA, ordinal);
    std::promise<absl::StatusOr<v1::AllocateResponse>> allocated;
    node.broker->Allocate(node.session, request, [&](auto r) { allocated.set_value(std::move(r)); });
    absl::StatusOr<v1::AllocateResponse> tensor = allocated.get_future().get();
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    std::unique_ptr<common::ImportedRegion> region = MapDevice(node, tensor->tensor());
    ASSERT_NE(region, nullptr);
    std::vector<int32_t> values(count);
    for (int64_t i = 0; i < count; ++i) values[i] = static_cast<int32_t>(i * 3 + fill);
    ASSERT_TRUE(region->stream_order()
                    ->CopyFromHost(region->data() + tensor->tensor().buffer().offset(), values.data(), count * 4,
                                   region->device_ordinal(), "test")
                    .ok());
    v1::PublishRequest publish;
    publish.set_tensor_id(tensor->tensor().tensor_id());
    publish.set_name(name);
    ASSERT_TRUE(node.broker->Publish(node.session, publish).ok());
    v1::ReleaseRequest release;
    release.add_lease_ids(tensor->lease_id());
    ASSERT_TRUE(node.broker->Release(node.session, release).ok());
  }

  // Acquires `name` on `node` (a take with `take`) and checks it is a device tensor on cuda
  // device `ordinal` holding i * 3 + fill; retries while the directory catches up.
  static void ExpectOnDevice(Node& node, const std::string& name, int32_t ordinal, int64_t count, int32_t fill,
                             bool take = false) {
    std::vector<int32_t> want(count);
    for (int64_t i = 0; i < count; ++i) want[i] = static_cast<int32_t>(i * 3 + fill);
    std::vector<int32_t> got;
    absl::Status last;
    for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(50))) {
      std::promise<absl::StatusOr<v1::AcquireResponse>> answer;
      auto done = [&](absl::StatusOr<v1::AcquireResponse> r) { answer.set_value(std::move(r)); };
      if (take) {
        v1::TakeRequest request;
        request.set_name_or_prefix(name);
        node.broker->Take(node.session, request, done);
      } else {
        v1::AcquireRequest request;
        request.set_name(name);
        node.broker->Acquire(node.session, request, done);
      }
      absl::StatusOr<v1::AcquireResponse> lease = answer.get_future().get();
      if (!lease.ok()) {
        last = lease.status();
        continue;
      }
      const v1::TensorInfo& tensor = lease->tensor();
      EXPECT_EQ(tensor.desc().device().type(), v1::DEVICE_TYPE_CUDA);
      EXPECT_EQ(tensor.desc().device().index(), ordinal);
      EXPECT_EQ(tensor.desc().device().uuid(), common::testing::FakeUuid(ordinal));
      if (!take) {  // a replica, not the owner's tensor (both nodes see the same fake devices)
        auto from = tensor.tags().find(kReplicaNodeTag);
        EXPECT_TRUE(from != tensor.tags().end() && from->second == "a") << name << " is not a's replica";
      }
      std::unique_ptr<common::ImportedRegion> region = MapDevice(node, tensor);
      got.assign(count, 0);
      if (region != nullptr) {
        EXPECT_TRUE(region->stream_order()
                        ->CopyToHost(got.data(), region->data() + tensor.buffer().offset(), count * 4,
                                     region->device_ordinal(), "test")
                        .ok());
      }
      region.reset();
      v1::ReleaseRequest release;
      release.add_lease_ids(lease->lease_id());
      (void)node.broker->Release(node.session, release);
      if (got == want) return;
      last = absl::FailedPreconditionError(absl::StrCat(name, " read ", got[0], ", ", got[count - 1], " not ",
                                                        want[0], ", ", want[count - 1]));
    }
    ADD_FAILURE() << name << ": " << last;
  }
};

TEST_F(ClusterNodeDeviceTest, ADeviceTensorCrossesNodesThroughHostMemory) {
  PutOnDevice(a_, "shared/weights", 1, 3 << 18, 5);  // 3 MiB on device 1
  ExpectOnDevice(b_, "shared/weights", 1, 3 << 18, 5);
  // A new generation on a replaces b's replica, on the device.
  PutOnDevice(a_, "shared/weights", 1, 3 << 18, 6);
  ExpectOnDevice(b_, "shared/weights", 1, 3 << 18, 6);
  // The owner's reads, and with them its host copies, end when b has the bytes.
  for (const absl::Time deadline = absl::Now() + absl::Seconds(5); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(20))) {
    v1::ClusterStatus a;
    a_.cluster->Describe(a);
    if (a.reads_open() == 0) break;
  }
  v1::ClusterStatus a;
  a_.cluster->Describe(a);
  EXPECT_EQ(a.reads_open(), 0u);
  EXPECT_EQ(a.reads_served(), 2u);
  // A take moves a device tensor the same way.
  PutOnDevice(a_, "shared/queue/1", 0, 1024, 9);
  ExpectOnDevice(b_, "shared/queue/1", 0, 1024, 9, /*take=*/true);
  EXPECT_EQ(Read(a_, "shared/queue/1").status().code(), absl::StatusCode::kNotFound);
  // Each of the three crossings: one copy to host memory on a, one to the device on b.
  v1::ClusterStatus after_a, after_b;
  a_.cluster->Describe(after_a);
  b_.cluster->Describe(after_b);
  EXPECT_EQ(after_a.device_copies(), 3u);
  EXPECT_EQ(after_b.device_copies(), 3u);
}
#endif  // TENSORD_FAKE_CUDA_PATH

}  // namespace
}  // namespace tensord::server::cluster
