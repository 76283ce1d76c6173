// What Broker::GetStatus tells about sessions and namespaces (tensorctl status and top, the
// metrics endpoint): who holds what, who may see whom, and leases reclaimed from sessions
// that ended holding them.
#include <unistd.h>

#include <algorithm>
#include <future>
#include <string>

#include "gtest/gtest.h"
#include "tests/unit/server/broker_fixture.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;
using testing::BrokerTest;

constexpr uid_t kOther = 4242;
constexpr uint64_t kTensorBytes = 16 * 4;  // PublishNew's float32[16]

class StatusTest : public BrokerTest {
 protected:
  v1::StatusResponse Status(uint64_t caller, bool sessions, bool namespaces) {
    v1::StatusRequest request;
    request.set_include_sessions(sessions);
    request.set_include_namespaces(namespaces);
    return broker_->GetStatus(request, caller);
  }

  static const v1::SessionUsage* Find(const v1::StatusResponse& status, uint64_t session) {
    for (const v1::SessionUsage& usage : status.session_usage()) {
      if (usage.id() == session) return &usage;
    }
    return nullptr;
  }
};

TEST_F(StatusTest, SessionsAreListedOnlyWhenAskedFor) {
  uint64_t session = Open();
  EXPECT_EQ(Status(session, false, false).session_usage_size(), 0);
  EXPECT_EQ(Status(session, false, false).namespace_usage_size(), 0);
  EXPECT_EQ(Status(session, true, false).session_usage_size(), 1);
}

TEST_F(StatusTest, EachSessionShowsWhatItHoldsAndMade) {
  uint64_t producer = Open();
  PublishNew(producer, "ns/x");
  uint64_t reader = Open();
  auto first = Acquire(reader, "ns/x");
  auto second = Acquire(reader, "ns/x");
  ASSERT_TRUE(first.ok() && second.ok());

  v1::StatusResponse status = Status(0, true, false);
  const v1::SessionUsage* made = Find(status, producer);
  const v1::SessionUsage* held = Find(status, reader);
  ASSERT_NE(made, nullptr);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(made->pid(), static_cast<uint32_t>(getpid()));
  EXPECT_EQ(made->uid(), getuid());
  EXPECT_EQ(made->client_name(), "test");
  EXPECT_EQ(made->tensors_produced(), 1u);
  EXPECT_EQ(made->bytes_produced(), kTensorBytes);
  EXPECT_EQ(made->publishes(), 1u);
  EXPECT_EQ(made->leases_granted(), 1u);  // its allocation's lease, released since
  EXPECT_EQ(made->leases(), 0u);
  EXPECT_EQ(held->leases(), 2u);
  EXPECT_EQ(held->bytes_leased(), kTensorBytes);  // one tensor, leased twice: its bytes once
  EXPECT_EQ(held->leases_granted(), 2u);
  EXPECT_EQ(held->tensors_produced(), 0u);
  EXPECT_GT(held->opened_unix_ms(), 0);
}

TEST_F(StatusTest, AnotherUidSeesOnlyItsOwnSessionsTheDaemonsUidSeesAll) {
  uint64_t mine = Open();
  uint64_t theirs = Open(kOther);
  uint64_t theirs_too = Open(kOther);
  v1::StatusResponse seen_by_other = Status(theirs, true, false);
  ASSERT_EQ(seen_by_other.session_usage_size(), 2);
  for (const v1::SessionUsage& usage : seen_by_other.session_usage()) EXPECT_EQ(usage.uid(), kOther);
  EXPECT_NE(Find(seen_by_other, theirs_too), nullptr);
  EXPECT_EQ(seen_by_other.sessions(), 3u);  // the count is everyone's
  EXPECT_EQ(Status(mine, true, false).session_usage_size(), 3);
}

TEST_F(StatusTest, NamespacesAddUpTheirTensorsByDevice) {
  uint64_t producer = Open();
  PublishNew(producer, "a/x");
  PublishNew(producer, "a/y");
  PublishNew(producer, "b/z");
  v1::StatusResponse status = Status(0, false, true);
  ASSERT_EQ(status.namespace_usage_size(), 2);
  EXPECT_EQ(status.namespace_usage(0).namespace_(), "a");
  EXPECT_EQ(status.namespace_usage(0).device(), "host");
  EXPECT_EQ(status.namespace_usage(0).tensors(), 2u);
  EXPECT_EQ(status.namespace_usage(0).bytes(), 2 * kTensorBytes);
  EXPECT_EQ(status.namespace_usage(1).namespace_(), "b");
  EXPECT_EQ(status.namespace_usage(1).tensors(), 1u);
}

// A uid with no grant learned every namespace's name, tensor count and bytes from Status,
// though List and Watch showed it only what it may read.
TEST_F(StatusTest, AnotherUidSeesOnlyTheNamespacesItMayRead) {
  uint64_t mine = Open();
  PublishNew(mine, "secret/x");
  PublishNew(mine, "shared/y");  // the fixture's ACL lets kOther read `shared`
  uint64_t theirs = Open(kOther);
  v1::StatusResponse seen = Status(theirs, false, true);
  ASSERT_EQ(seen.namespace_usage_size(), 1);
  EXPECT_EQ(seen.namespace_usage(0).namespace_(), "shared");
  EXPECT_EQ(seen.namespace_usage(0).tensors(), 1u);
  EXPECT_EQ(seen.tensors(), 2u);  // the totals are everyone's, as the session count is
  // The daemon's uid, and the metrics page (no session), see every namespace.
  EXPECT_EQ(Status(mine, false, true).namespace_usage_size(), 2);
  EXPECT_EQ(Status(0, false, true).namespace_usage_size(), 2);
}

TEST_F(StatusTest, LeasesHeldWhenASessionEndsAreCountedAsReclaimed) {
  uint64_t producer = Open();
  PublishNew(producer, "ns/x");
  uint64_t reader = Open();
  ASSERT_TRUE(Acquire(reader, "ns/x").ok());
  ASSERT_TRUE(Acquire(reader, "ns/x").ok());
  EXPECT_EQ(broker_->GetStatus().leases_reclaimed(), 0u);
  broker_->CloseSession(reader);
  EXPECT_EQ(broker_->GetStatus().leases_reclaimed(), 2u);
  broker_->CloseSession(producer);  // held none
  EXPECT_EQ(broker_->GetStatus().leases_reclaimed(), 2u);
}

// Status's figures are running counts kept where tensors and leases change: after every
// kind of change they equal a recount of every tensor and lease.
TEST_F(StatusTest, RunningFiguresEqualARecountAfterEveryKindOfChange) {
  auto check = [&](const char* after) { EXPECT_TRUE(broker_->UsageMatchesRecountForTest()) << "after " << after; };
  uint64_t producer = Open();
  uint64_t reader = Open();
  uint64_t other = Open(kOther);
  PublishNew(producer, "a/x");
  PublishNew(producer, "a/y");
  PublishNew(producer, "shared/q/1");
  PublishNew(producer, "shared/q/2");
  check("publishes");
  PublishNew(producer, "a/x");  // replaces a/x: the old one goes
  check("a replacement");
  auto held = Acquire(reader, "a/y");
  auto held_twice = Acquire(reader, "a/y");
  ASSERT_TRUE(held.ok() && held_twice.ok());
  check("acquires");
  Delete(producer, "a/y");  // still leased: it stays, unbound
  check("a delete of a leased tensor");
  Release(reader, held->lease_id());
  check("a release of one of two leases");
  Release(reader, held_twice->lease_id());
  check("the last release");
  // Allocated without a namespace, published unnamed with a smaller description: its row
  // is its producer uid's, its bytes the new description's.
  auto unnamed = Allocate(other, "", 64);
  ASSERT_TRUE(unnamed.ok()) << unnamed.status();
  check("an allocation without a namespace");
  Seal(other, *unnamed);
  v1::PublishRequest publish;
  publish.set_tensor_id(unnamed->tensor().tensor_id());
  *publish.mutable_desc() = Float32Request("", 8).desc();
  ASSERT_TRUE(broker_->Publish(other, publish).ok());
  check("an unnamed publish with a new description");
  std::promise<absl::StatusOr<v1::AcquireResponse>> taken;
  v1::TakeRequest take;
  take.set_name_or_prefix("shared/q/");
  broker_->Take(reader, take, [&](absl::StatusOr<v1::AcquireResponse> r) { taken.set_value(std::move(r)); });
  ASSERT_TRUE(taken.get_future().get().ok());
  check("a take");
  auto zero = Allocate(producer, "a", 0);
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_TRUE(Publish(producer, zero->tensor().tensor_id(), "a/zero").ok());
  ASSERT_TRUE(Acquire(reader, "a/zero").ok());
  check("a zero-byte tensor published and acquired");
  ASSERT_TRUE(Acquire(reader, "a/x").ok());
  broker_->CloseSession(reader);  // its leases go with it, and the tensor it took
  check("the death of a taker");
  broker_->CloseSession(other);  // its unnamed tensor goes
  check("the death of an unnamed tensor's producer");
  broker_->CloseSession(producer);  // its named tensors stay, produced by no open session
  check("a producer's death");

  // The figures themselves: a/x, a/zero and shared/q/2 remain, each counted once.
  v1::StatusResponse status = Status(0, true, true);
  EXPECT_EQ(status.tensors(), 3u);
  ASSERT_EQ(status.namespace_usage_size(), 2);
  EXPECT_EQ(status.namespace_usage(0).namespace_(), "a");
  EXPECT_EQ(status.namespace_usage(0).tensors(), 2u);
  EXPECT_EQ(status.namespace_usage(0).bytes(), kTensorBytes);
  EXPECT_EQ(status.namespace_usage(1).namespace_(), "shared");
  EXPECT_EQ(status.namespace_usage(1).tensors(), 1u);
  EXPECT_EQ(status.session_usage_size(), 0);
}

// Status walked every tensor under the broker's lock: with 150,000 zero-byte tensors, one
// caller looping it stalled every other client. Now it walks one row per namespace and
// device, and the sessions, however many tensors there are.
TEST_F(StatusTest, StatusWalksNamespaceRowsNotTensors) {
  Start([](BrokerOptions& options) { options.max_leases_per_session = 1 << 20; });
  uint64_t producer = Open();
  for (int i = 0; i < 2; ++i) PublishNew(producer, "few/t" + std::to_string(i));
  EXPECT_EQ(broker_->UsageRowsForTest(), 1u);
  constexpr int kMany = 50000;
  for (int i = 0; i < kMany; ++i) {
    auto allocated = Allocate(producer, "many", 0);
    ASSERT_TRUE(allocated.ok()) << allocated.status();
    ASSERT_TRUE(Publish(producer, allocated->tensor().tensor_id(), "many/t" + std::to_string(i)).ok());
  }
  EXPECT_EQ(broker_->UsageRowsForTest(), 2u);
  v1::StatusResponse status = Status(producer, true, true);
  ASSERT_EQ(status.namespace_usage_size(), 2);
  EXPECT_EQ(status.namespace_usage(1).namespace_(), "many");
  EXPECT_EQ(status.namespace_usage(1).tensors(), static_cast<uint64_t>(kMany));
  ASSERT_EQ(status.session_usage_size(), 1);
  EXPECT_EQ(status.session_usage(0).tensors_produced(), kMany + 2u);
  EXPECT_EQ(status.session_usage(0).leases(), static_cast<uint64_t>(kMany));  // the producer's own
  EXPECT_TRUE(broker_->UsageMatchesRecountForTest());
}

}  // namespace
}  // namespace tensord::server
