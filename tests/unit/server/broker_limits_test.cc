// The Broker's caps (sessions, leases per session, pending waits per session), the release
// batch bound, extreme timeouts, token binding and tag checks: each refusal is
// RESOURCE_EXHAUSTED / INVALID_ARGUMENT / UNAUTHENTICATED naming what was exceeded, and
// nothing is half-made.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/memory/host/memfd.h"
#include "gtest/gtest.h"
#include "tests/unit/server/broker_fixture.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;
using namespace std::chrono_literals;

class BrokerLimitsTest : public testing::BrokerTest {
 protected:
  // Starts an acquire that may wait; the result arrives on the future.
  std::future<absl::StatusOr<v1::AcquireResponse>> StartAcquire(uint64_t session, const std::string& name,
                                                                uint64_t timeout_ms, uint64_t* wait_id = nullptr) {
    auto promise = std::make_shared<std::promise<absl::StatusOr<v1::AcquireResponse>>>();
    auto future = promise->get_future();
    v1::AcquireRequest request;
    request.set_name(name);
    request.set_timeout_ms(timeout_ms);
    uint64_t id = broker_->Acquire(session, request, [promise](absl::StatusOr<v1::AcquireResponse> r) {
      promise->set_value(std::move(r));
    });
    if (wait_id != nullptr) *wait_id = id;
    return future;
  }

  std::future<absl::StatusOr<v1::AcquireResponse>> StartTake(uint64_t session, const std::string& target,
                                                             uint64_t timeout_ms) {
    auto promise = std::make_shared<std::promise<absl::StatusOr<v1::AcquireResponse>>>();
    auto future = promise->get_future();
    v1::TakeRequest request;
    request.set_name_or_prefix(target);
    if (timeout_ms > 0) request.set_timeout_ms(timeout_ms);
    broker_->Take(session, request, [promise](absl::StatusOr<v1::AcquireResponse> r) {
      promise->set_value(std::move(r));
    });
    return future;
  }

  static bool Ready(const std::future<absl::StatusOr<v1::AcquireResponse>>& future) {
    return future.wait_for(0s) == std::future_status::ready;
  }
};

TEST_F(BrokerLimitsTest, SessionsBeyondTheCapAreRefusedNamingTheLimit) {
  Start([](BrokerOptions& options) { options.max_sessions = 2; });
  uint64_t first = Open();
  Open();
  common::PeerCredentials creds{getuid(), getgid(), getpid()};
  auto refused = broker_->OpenSession(creds, "third");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("--max-sessions 2"), std::string::npos) << refused.status();
  EXPECT_EQ(broker_->GetStatus().sessions(), 2u);
  broker_->CloseSession(first);
  EXPECT_TRUE(broker_->OpenSession(creds, "third").ok());
}

TEST_F(BrokerLimitsTest, LeasesPerSessionAreCappedAndNothingIsHalfMade) {
  Start([](BrokerOptions& options) { options.max_leases_per_session = 3; });
  uint64_t producer = Open();
  PublishNew(producer, "ns/x");
  PublishNew(producer, "q/item");
  uint64_t consumer = Open();
  std::vector<uint64_t> leases;
  uint64_t tensor_id = 0;
  for (int i = 0; i < 3; ++i) {
    auto lease = Acquire(consumer, "ns/x");
    ASSERT_TRUE(lease.ok()) << lease.status();
    leases.push_back(lease->lease_id());
    tensor_id = lease->tensor().tensor_id();
  }
  v1::StatusResponse before = broker_->GetStatus();

  auto refused = Acquire(consumer, "ns/x");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("--max-leases-per-session 3"), std::string::npos)
      << refused.status();
  EXPECT_EQ(Allocate(consumer, "ns", 1024).status().code(), absl::StatusCode::kResourceExhausted);
  auto take = StartTake(consumer, "q/item", 0);
  EXPECT_EQ(take.get().status().code(), absl::StatusCode::kResourceExhausted);
  v1::AcquireRequest by_id;
  by_id.set_tensor_id(tensor_id);
  std::promise<absl::StatusOr<v1::AcquireResponse>> by_id_result;
  broker_->Acquire(consumer, by_id, [&](absl::StatusOr<v1::AcquireResponse> r) { by_id_result.set_value(std::move(r)); });
  EXPECT_EQ(by_id_result.get_future().get().status().code(), absl::StatusCode::kResourceExhausted);

  v1::StatusResponse after = broker_->GetStatus();
  EXPECT_EQ(after.leases(), before.leases());
  EXPECT_EQ(after.tensors(), before.tensors());
  EXPECT_EQ(after.named_tensors(), before.named_tensors()) << "a refused take must not unbind";
  EXPECT_EQ(after.host_bytes_in_use(), before.host_bytes_in_use());

  // Another session is not limited by this one, and a release makes room again.
  EXPECT_TRUE(Acquire(Open(), "ns/x").ok());
  v1::ReleaseRequest release;
  release.add_lease_ids(leases[0]);
  ASSERT_TRUE(broker_->Release(consumer, release).ok());
  EXPECT_TRUE(Acquire(consumer, "ns/x").ok());
}

TEST_F(BrokerLimitsTest, AWaiterAtItsLeaseCapFailsAndLeavesTheTensorToOthers) {
  Start([](BrokerOptions& options) { options.max_leases_per_session = 1; });
  uint64_t producer = Open();
  PublishNew(producer, "ns/x");
  uint64_t full = Open();
  ASSERT_TRUE(Acquire(full, "ns/x").ok());
  auto acquire = StartAcquire(full, "ns/later", 10000);
  auto take = StartTake(full, "q/", 10000);
  uint64_t other = Open();
  auto other_take = StartTake(other, "q/", 10000);
  std::this_thread::sleep_for(20ms);
  PublishNew(producer, "ns/later");
  PublishNew(producer, "q/a");
  ASSERT_EQ(acquire.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(acquire.get().status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(take.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(take.get().status().code(), absl::StatusCode::kResourceExhausted);
  // The take the full session could not complete went to the next waiter.
  ASSERT_EQ(other_take.wait_for(5s), std::future_status::ready);
  auto taken = other_take.get();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->tensor().name(), "q/a");
}

TEST_F(BrokerLimitsTest, PendingWaitsPerSessionAreCapped) {
  Start([](BrokerOptions& options) { options.max_waits_per_session = 2; });
  uint64_t consumer = Open();
  uint64_t first_id = 0;
  auto first = StartAcquire(consumer, "ns/a", 60000, &first_id);
  auto second = StartTake(consumer, "q/", 60000);
  auto third = StartAcquire(consumer, "ns/c", 60000);
  ASSERT_TRUE(Ready(third));
  auto refused = third.get();
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("--max-waits-per-session 2"), std::string::npos)
      << refused.status();
  EXPECT_FALSE(Ready(first));
  EXPECT_FALSE(Ready(second));

  // Another session has its own allowance; a completed wait frees a place.
  uint64_t other = Open();
  auto others = StartAcquire(other, "ns/a", 60000);
  EXPECT_FALSE(Ready(others));
  ASSERT_NE(first_id, 0u);
  broker_->CancelWait(first_id);
  EXPECT_EQ(first.get().status().code(), absl::StatusCode::kCancelled);
  auto fourth = StartAcquire(consumer, "ns/d", 60000);
  EXPECT_FALSE(Ready(fourth));
  // A wait that ends by its timeout frees its place too.
  broker_->CloseSession(other);
  EXPECT_EQ(others.get().status().code(), absl::StatusCode::kCancelled);
  broker_->CloseSession(consumer);
  EXPECT_EQ(second.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(fourth.get().status().code(), absl::StatusCode::kCancelled);
}

TEST_F(BrokerLimitsTest, ExpiredAndGrantedWaitsFreeTheirPlaces) {
  Start([](BrokerOptions& options) { options.max_waits_per_session = 1; });
  uint64_t producer = Open();
  uint64_t consumer = Open();
  EXPECT_EQ(Acquire(consumer, "ns/a", 20).status().code(), absl::StatusCode::kDeadlineExceeded);
  auto granted = StartAcquire(consumer, "ns/b", 60000);
  PublishNew(producer, "ns/b");
  ASSERT_EQ(granted.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(granted.get().ok());
  auto next = StartAcquire(consumer, "ns/c", 60000);
  EXPECT_FALSE(Ready(next));
  broker_->CloseSession(consumer);
}

TEST_F(BrokerLimitsTest, AnOversizedReleaseBatchReleasesNothing) {
  uint64_t producer = Open();
  PublishNew(producer, "ns/x");
  uint64_t consumer = Open();
  auto lease = Acquire(consumer, "ns/x");
  ASSERT_TRUE(lease.ok());
  v1::ReleaseRequest release;
  release.add_lease_ids(lease->lease_id());
  for (size_t i = 0; i < common::kMaxReleaseBatch; ++i) release.add_lease_ids(1000000 + i);
  auto refused = broker_->Release(consumer, release);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("65536"), std::string::npos) << refused.status();
  EXPECT_EQ(broker_->GetStatus().leases(), 1u);
  EXPECT_EQ(broker_->GetStatus().releases_not_found(), 0u);
}

TEST_F(BrokerLimitsTest, AHugeTimeoutWaitsInsteadOfExpiringAtOnce) {
  uint64_t consumer = Open();
  auto waiting = StartAcquire(consumer, "ns/x", std::numeric_limits<uint64_t>::max());
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(Ready(waiting)) << "a timeout past the clock's range expired at once";
  PublishNew(Open(), "ns/x");
  ASSERT_EQ(waiting.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(waiting.get().ok());
}

TEST_F(BrokerLimitsTest, ATokenIsHonouredOnlyFromTheCredentialsThatOpenedItsSession) {
  common::PeerCredentials owner{getuid(), getgid(), getpid()};
  auto welcome = broker_->OpenSession(owner, "owner");
  ASSERT_TRUE(welcome.ok());
  const std::string& token = welcome->session_token();
  EXPECT_EQ(token.size(), 32u);
  auto ok = broker_->Authenticate(token, owner);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, welcome->session_id());
  // The pid is for display only: another process of the same user may use the token.
  EXPECT_TRUE(broker_->Authenticate(token, {owner.uid, owner.gid, owner.pid + 1}).ok());
  auto other_uid = broker_->Authenticate(token, {owner.uid + 1, owner.gid, owner.pid});
  EXPECT_EQ(other_uid.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(other_uid.status().message().find(token), std::string::npos) << "the message shows the token";
  EXPECT_EQ(broker_->Authenticate(token, {owner.uid, owner.gid + 1, owner.pid}).status().code(),
            absl::StatusCode::kUnauthenticated);
  broker_->CloseSession(welcome->session_id());
  EXPECT_EQ(broker_->Authenticate(token, owner).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(BrokerLimitsTest, ExportChecksTagsBeforeTakingTheStagedFd) {
  uint64_t session = Open();
  auto memfd = common::CreateSealedMemfd("export-test", 4096);
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  auto staged = broker_->StageFd(session, std::move(*memfd));
  ASSERT_TRUE(staged.ok()) << staged.status();
  v1::ExportRequest request;
  request.set_staged_fd_id(staged->staged_fd_id());
  request.set_ns("ns");
  v1::TensorDesc* desc = request.mutable_desc();
  desc->mutable_dtype()->set_code(v1::DTYPE_CODE_FLOAT);
  desc->mutable_dtype()->set_bits(32);
  desc->mutable_dtype()->set_lanes(1);
  desc->add_shape(16);
  desc->mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
  for (int i = 0; i < 100; ++i) {
    // insert(), not operator[]= "v": GCC 12 warns falsely (-Wrestrict) on that.
    request.mutable_tags()->insert({absl::StrCat("k", i), std::string(1, 'v')});
  }
  EXPECT_EQ(broker_->Export(session, request).status().code(), absl::StatusCode::kInvalidArgument);
  request.clear_tags();
  (*request.mutable_tags())["k"] = std::string(100000, 'v');
  EXPECT_EQ(broker_->Export(session, request).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u);
  // Still staged: a valid request goes through.
  request.clear_tags();
  auto exported = broker_->Export(session, request);
  EXPECT_TRUE(exported.ok()) << exported.status();
}

// Copies published evictable (the cluster's replicas) give way to an allocation that finds
// the host quota full: the oldest first, only those no lease holds; a tensor published
// plainly never does.
TEST_F(BrokerLimitsTest, EvictableCopiesMakeRoomOldestFirstWhileNothingHoldsThem) {
  Start([](BrokerOptions& options) { options.max_host_bytes = 16 << 20; });
  const uint64_t session = Open();
  constexpr int64_t kMiB = (1 << 20) / 4;  // float32s in a MiB
  auto put = [&](const std::string& name, bool evictable) {
    absl::StatusOr<v1::AllocateResponse> allocated = Allocate(session, "copies", 4 * kMiB);
    ASSERT_TRUE(allocated.ok()) << allocated.status();
    Seal(session, *allocated);
    v1::PublishRequest publish;
    publish.set_tensor_id(allocated->tensor().tensor_id());
    publish.set_name(name);
    publish.set_evictable(evictable);
    ASSERT_TRUE(broker_->Publish(session, publish).ok());
    Release(session, allocated->lease_id());
    std::this_thread::sleep_for(5ms);  // a creation time of its own: "oldest" is well defined
  };
  put("copies/old", true);
  put("copies/held", true);
  put("copies/plain", false);
  absl::StatusOr<v1::AcquireResponse> held = Acquire(session, "copies/held");
  ASSERT_TRUE(held.ok()) << held.status();

  // 12 of 16 MiB in use: 8 MiB more need 4, which the oldest copy nobody holds gives.
  absl::StatusOr<v1::AllocateResponse> big = Allocate(session, "other", 8 * kMiB);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(Acquire(session, "copies/old").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<v1::AcquireResponse> plain = Acquire(session, "copies/plain");
  ASSERT_TRUE(plain.ok()) << plain.status();
  Release(session, plain->lease_id());

  // 16 of 16 in use, and the one copy left is held: the allocation is refused, and
  // nothing is unbound for it.
  absl::StatusOr<v1::AllocateResponse> refused = Allocate(session, "other", 4 * kMiB);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  for (const char* name : {"copies/held", "copies/plain"}) {
    absl::StatusOr<v1::AcquireResponse> still = Acquire(session, name);
    ASSERT_TRUE(still.ok()) << name << ": " << still.status();
    Release(session, still->lease_id());
  }
  // Once its lease goes, the held copy makes room too.
  Release(session, held->lease_id());
  absl::StatusOr<v1::AllocateResponse> granted = Allocate(session, "other", 4 * kMiB);
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(Acquire(session, "copies/held").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tensord::server
