// The Broker in-process, without gRPC: sessions, leases, waits, take, quotas, sealing.
#include "server/broker/broker.h"

#include <unistd.h>

#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/server/broker_fixture.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;
using testing::BrokerTest;

TEST_F(BrokerTest, PublishRefusesABufferWithoutTheWriteSeal) {
  uint64_t session = Open();
  auto allocated = Allocate(session, "ns", 16);
  ASSERT_TRUE(allocated.ok());
  auto published = Publish(session, allocated->tensor().tensor_id(), "ns/x");
  EXPECT_EQ(published.status().code(), absl::StatusCode::kFailedPrecondition);
  Seal(session, *allocated);
  EXPECT_TRUE(Publish(session, allocated->tensor().tensor_id(), "ns/x").ok());
}

TEST_F(BrokerTest, ClosingASessionReleasesItsLeasesAndDropsWhatItWasCreating) {
  uint64_t producer = Open();
  PublishNew(producer, "ns/x");
  uint64_t consumer = Open();
  ASSERT_TRUE(Acquire(consumer, "ns/x").ok());
  ASSERT_TRUE(Allocate(consumer, "ns", 1024).ok());  // never published
  EXPECT_EQ(broker_->GetStatus().leases(), 2u);
  EXPECT_EQ(broker_->GetStatus().tensors(), 2u);
  broker_->CloseSession(consumer);
  v1::StatusResponse status = broker_->GetStatus();
  EXPECT_EQ(status.leases(), 0u);
  EXPECT_EQ(status.tensors(), 1u);
  EXPECT_EQ(status.host_bytes_in_use(), 4096u);
}

TEST_F(BrokerTest, ReleaseOfAnotherSessionsLeaseIsNotFoundAndCounted) {
  uint64_t producer = Open();
  PublishNew(producer, "ns/x");
  uint64_t a = Open();
  uint64_t b = Open();
  auto lease = Acquire(a, "ns/x");
  ASSERT_TRUE(lease.ok());
  v1::ReleaseRequest release;
  release.add_lease_ids(lease->lease_id());
  absl::StatusOr<v1::ReleaseResponse> response = broker_->Release(b, release);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->released(), 0u);
  ASSERT_EQ(response->not_found_size(), 1);
  EXPECT_EQ(broker_->GetStatus().releases_not_found(), 1u);
  EXPECT_EQ(broker_->Release(a, release)->released(), 1u);
}

TEST_F(BrokerTest, AWaitingAcquireCompletesWhenTheNameIsPublished) {
  uint64_t consumer = Open();
  auto waiting = std::async(std::launch::async, [&] { return Acquire(consumer, "ns/later", 10000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  uint64_t producer = Open();
  uint64_t id = PublishNew(producer, "ns/later");
  auto result = waiting.get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tensor().tensor_id(), id);
}

TEST_F(BrokerTest, AWaitExpiresWithDeadlineExceeded) {
  uint64_t consumer = Open();
  EXPECT_EQ(Acquire(consumer, "ns/never", 30).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Acquire(consumer, "ns/never").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BrokerTest, QuotaIsCheckedBeforeAnythingIsMade) {
  uint64_t session = Open();
  auto too_big = Allocate(session, "ns", 32 << 20);  // 128 MiB of float32 > 64 MiB
  ASSERT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("67108864"), std::string::npos) << too_big.status();
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u);
  EXPECT_EQ(broker_->GetStatus().host_bytes_in_use(), 0u);
}

TEST_F(BrokerTest, NamespacesNeedAnAclForOtherUids) {
  uint64_t owner = Open();
  PublishNew(owner, "private/x");
  PublishNew(owner, "shared/x");
  uint64_t stranger = Open(4242);
  EXPECT_EQ(Acquire(stranger, "private/x").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Acquire(stranger, "shared/x").ok());
  EXPECT_EQ(Allocate(stranger, "shared", 4).status().code(), absl::StatusCode::kPermissionDenied);
  v1::ListRequest list;
  auto listed = broker_->List(stranger, list);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->tensors_size(), 1);
  EXPECT_EQ(listed->tensors(0).name(), "shared/x");
}

TEST_F(BrokerTest, ConditionalPublish) {
  uint64_t session = Open();
  PublishNew(session, "ns/x");
  uint64_t generation = broker_->Stat(session, [] { v1::StatRequest r; r.set_name("ns/x"); return r; }())->tensor().generation();
  auto allocated = Allocate(session, "ns", 4);
  Seal(session, *allocated);
  v1::PublishRequest request;
  request.set_tensor_id(allocated->tensor().tensor_id());
  request.set_name("ns/x");
  request.set_if_absent(true);
  EXPECT_EQ(broker_->Publish(session, request).status().code(), absl::StatusCode::kAlreadyExists);
  request.set_if_generation(generation + 100);
  EXPECT_EQ(broker_->Publish(session, request).status().code(), absl::StatusCode::kAborted);
  request.set_if_generation(generation);
  EXPECT_TRUE(broker_->Publish(session, request).ok());
}

TEST_F(BrokerTest, UnknownTokensAreUnauthenticated) {
  common::PeerCredentials us{getuid(), getgid(), getpid()};
  EXPECT_EQ(broker_->Authenticate("00000000000000000000000000000000", us).status().code(),
            absl::StatusCode::kUnauthenticated);
  uint64_t session = Open();
  v1::FetchFd fetch;
  fetch.add_buffer_ids(12345);
  EXPECT_EQ(broker_->FetchHandles(session, fetch).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tensord::server

namespace tensord::server::testing {
namespace {

// Records the tensor ids of the `retired` pushes a session's stream would carry.
class RetiredRecorder final : public PushSink {
 public:
  bool Push(const v1::SessionResponse& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (message.has_retired()) ids_.push_back(message.retired().tensor_id());
    return true;
  }
  void Close() override {}
  std::vector<uint64_t> ids() {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_;
  }

 private:
  std::mutex mu_;
  std::vector<uint64_t> ids_;
};

TEST_F(BrokerTest, OnlySessionsThatAcquiredByNameHearThatATensorRetired) {
  const uint64_t producer = Open();
  const uint64_t by_name = Open();
  const uint64_t by_id = Open();
  const uint64_t taker = Open();
  auto sink = [&](uint64_t session) {
    auto recorder = std::make_shared<RetiredRecorder>();
    EXPECT_TRUE(broker_->AttachSink(session, recorder).ok());
    return recorder;
  };
  auto producer_hears = sink(producer);
  auto by_name_hears = sink(by_name);
  auto by_id_hears = sink(by_id);
  auto taker_hears = sink(taker);

  // The producer keeps its own lease; one reader acquires by name, one by id.
  auto allocated = Allocate(producer, "ns", 16);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  Seal(producer, *allocated);
  const uint64_t first = allocated->tensor().tensor_id();
  ASSERT_TRUE(Publish(producer, first, "ns/a").ok());
  ASSERT_TRUE(Acquire(by_name, "ns/a").ok());
  v1::AcquireRequest by_id_request;
  by_id_request.set_tensor_id(first);
  std::promise<absl::StatusOr<v1::AcquireResponse>> got;
  broker_->Acquire(by_id, by_id_request, [&](absl::StatusOr<v1::AcquireResponse> r) { got.set_value(std::move(r)); });
  ASSERT_TRUE(got.get_future().get().ok());

  // Re-publishing the name retires the first tensor: only the name's reader may have it cached.
  PublishNew(producer, "ns/a");
  EXPECT_EQ(by_name_hears->ids(), std::vector<uint64_t>{first});
  EXPECT_TRUE(producer_hears->ids().empty());
  EXPECT_TRUE(by_id_hears->ids().empty());

  // A take unbinds: the reader by name hears it, the taker does not hear of its own take.
  const uint64_t second = PublishNew(producer, "ns/b");
  ASSERT_TRUE(Acquire(by_name, "ns/b").ok());
  v1::TakeRequest take;
  take.set_name_or_prefix("ns/b");
  std::promise<absl::StatusOr<v1::AcquireResponse>> taken;
  broker_->Take(taker, take, [&](absl::StatusOr<v1::AcquireResponse> r) { taken.set_value(std::move(r)); });
  ASSERT_TRUE(taken.get_future().get().ok());
  EXPECT_EQ(by_name_hears->ids(), (std::vector<uint64_t>{first, second}));
  EXPECT_TRUE(taker_hears->ids().empty());

  // A waiting acquire by name, granted at publish, counts as by name too.
  std::promise<absl::StatusOr<v1::AcquireResponse>> waited;
  v1::AcquireRequest wait;
  wait.set_name("ns/c");
  wait.set_timeout_ms(10000);
  broker_->Acquire(by_id, wait, [&](absl::StatusOr<v1::AcquireResponse> r) { waited.set_value(std::move(r)); });
  const uint64_t third = PublishNew(producer, "ns/c");
  ASSERT_TRUE(waited.get_future().get().ok());
  v1::DeleteRequest remove;
  remove.set_name("ns/c");
  ASSERT_TRUE(broker_->Delete(producer, remove).ok());
  EXPECT_EQ(by_id_hears->ids(), std::vector<uint64_t>{third});
  EXPECT_TRUE(producer_hears->ids().empty());
}

}  // namespace
}  // namespace tensord::server::testing

namespace tensord::server::testing {
namespace {

TEST_F(BrokerTest, APublishTakenAtOnceByAWaitingTakeIsStillAnsweredAsPublished) {
  const uint64_t producer = Open();
  const uint64_t taker = Open();
  v1::TakeRequest take;
  take.set_name_or_prefix("ns/q/");
  take.set_timeout_ms(10000);
  std::promise<absl::StatusOr<v1::AcquireResponse>> taken;
  broker_->Take(taker, take, [&](absl::StatusOr<v1::AcquireResponse> r) { taken.set_value(std::move(r)); });
  auto allocated = Allocate(producer, "ns", 16);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  Seal(producer, *allocated);
  v1::PublishRequest publish;
  publish.set_tensor_id(allocated->tensor().tensor_id());
  publish.set_name("ns/q/1");
  publish.set_ttl_ms(60000);
  auto published = broker_->Publish(producer, publish);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->tensor().state(), v1::TENSOR_STATE_SEALED);
  EXPECT_EQ(published->tensor().name(), "ns/q/1");
  EXPECT_GT(published->tensor().generation(), 0u);
  auto got = taken.get_future().get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tensor().tensor_id(), allocated->tensor().tensor_id());
  // The take unbound it: the name is free again.
  EXPECT_FALSE(Acquire(producer, "ns/q/1").ok());
}

// unbind_on_exit: what the session published and is still bound goes with it; a name it
// no longer binds (taken, replaced) is left alone, and leases taken before stay good.
TEST_F(BrokerTest, APublishBoundToItsSessionIsUnboundWhenTheSessionEnds) {
  const uint64_t producer = Open();
  const uint64_t other = Open();
  auto publish = [&](const std::string& name) {
    auto allocated = Allocate(producer, "ns", 16);
    EXPECT_TRUE(allocated.ok()) << allocated.status();
    Seal(producer, *allocated);
    v1::PublishRequest request;
    request.set_tensor_id(allocated->tensor().tensor_id());
    request.set_name(name);
    request.set_unbind_on_exit(true);
    EXPECT_TRUE(broker_->Publish(producer, request).ok());
    Release(producer, allocated->lease_id());
  };
  publish("ns/gone");
  publish("ns/held");
  publish("ns/replaced");
  publish("ns/kept");
  auto held = Acquire(other, "ns/held");
  ASSERT_TRUE(held.ok()) << held.status();
  PublishNew(other, "ns/replaced");  // another session's tensor is bound there now
  v1::TakeRequest take;
  take.set_name_or_prefix("ns/kept");
  std::promise<absl::StatusOr<v1::AcquireResponse>> taken;
  broker_->Take(other, take, [&](absl::StatusOr<v1::AcquireResponse> r) { taken.set_value(std::move(r)); });
  ASSERT_TRUE(taken.get_future().get().ok());
  PublishNew(producer, "ns/plain");  // without unbind_on_exit
  broker_->CloseSession(producer);
  EXPECT_EQ(Acquire(other, "ns/gone").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Acquire(other, "ns/held").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Acquire(other, "ns/replaced").ok());
  EXPECT_TRUE(Acquire(other, "ns/plain").ok());
  // The lease taken before the producer went still holds its tensor.
  v1::StatRequest stat;
  stat.set_tensor_id(held->tensor().tensor_id());
  auto described = broker_->Stat(other, stat);
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->tensor().state(), v1::TENSOR_STATE_RETIRED);
  EXPECT_TRUE(broker_->UsageMatchesRecountForTest());
}

}  // namespace
}  // namespace tensord::server::testing
