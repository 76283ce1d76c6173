// Lease hand-overs in the Broker (broker_hand_over.cc) and their table (HandOverTable): a
// token is redeemed once, holds its tensor whatever becomes of its maker, expires leaving
// nothing, and is checked like an acquire.
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/hand_over_table.h"
#include "tests/unit/server/broker_fixture.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;
using namespace std::chrono_literals;
using testing::BrokerTest;

constexpr uid_t kReader = 4242;  // may read "shared" (the fixture's ACL)

class HandOverTest : public BrokerTest {
 protected:
  absl::StatusOr<v1::HandOverResponse> HandOver(uint64_t session, uint64_t lease_id, uint64_t ttl_ms = 0) {
    v1::HandOverRequest request;
    request.set_lease_id(lease_id);
    request.set_ttl_ms(ttl_ms);
    return broker_->HandOver(session, request);
  }

  absl::StatusOr<v1::AcquireResponse> Redeem(uint64_t session, const std::string& token) {
    v1::AcquireRequest request;
    request.set_hand_over(token);
    request.set_timeout_ms(10000);  // a hand-over never waits: this must not matter
    std::promise<absl::StatusOr<v1::AcquireResponse>> promise;
    uint64_t wait_id =
        broker_->Acquire(session, request, [&](absl::StatusOr<v1::AcquireResponse> r) { promise.set_value(std::move(r)); });
    EXPECT_EQ(wait_id, 0u);
    return promise.get_future().get();
  }

  // A tensor published as `name` and a lease on it held by a new session, which is returned.
  std::pair<uint64_t, v1::AcquireResponse> HeldBySender(const std::string& name) {
    uint64_t producer = Open();
    PublishNew(producer, name);
    uint64_t sender = Open();
    auto lease = Acquire(sender, name);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return {sender, *lease};
  }

  // Waits up to 5 s for the broker to hold no tensor.
  bool TensorsGone() {
    for (int i = 0; i < 500; ++i) {
      if (broker_->GetStatus().tensors() == 0) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

TEST_F(HandOverTest, ATokenIsRedeemedOnceForALeaseOfTheRedeemersOwn) {
  auto [sender, lease] = HeldBySender("ns/x");
  auto token = HandOver(sender, lease.lease_id());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->token().size(), 64u);
  EXPECT_EQ(token->tensor().tensor_id(), lease.tensor().tensor_id());
  EXPECT_EQ(token->ttl_ms(), 60000u);
  EXPECT_EQ(broker_->GetStatus().hand_overs_pending(), 1u);

  uint64_t receiver = Open();
  auto redeemed = Redeem(receiver, token->token());
  ASSERT_TRUE(redeemed.ok()) << redeemed.status();
  EXPECT_EQ(redeemed->tensor().tensor_id(), lease.tensor().tensor_id());
  EXPECT_NE(redeemed->lease_id(), lease.lease_id());
  EXPECT_EQ(broker_->GetStatus().hand_overs_pending(), 0u);
  // The lease is the receiver's: it releases it, the sender's is untouched.
  Release(receiver, redeemed->lease_id());
  Release(sender, lease.lease_id());

  auto again = Redeem(Open(), token->token());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(again.status().message().find("redeemed already"), std::string::npos) << again.status();
}

TEST_F(HandOverTest, TheTokenHoldsTheTensorAfterItsMakerReleasedAndClosed) {
  auto [sender, lease] = HeldBySender("ns/batch");
  Delete(sender, "ns/batch");  // unbound: only leases keep it now
  auto token = HandOver(sender, lease.lease_id());
  ASSERT_TRUE(token.ok()) << token.status();
  Release(sender, lease.lease_id());
  broker_->CloseSession(sender);
  EXPECT_EQ(broker_->GetStatus().tensors(), 1u) << "the pending hand-over holds the tensor";
  EXPECT_EQ(broker_->GetStatus().leases(), 0u);

  uint64_t receiver = Open();
  auto redeemed = Redeem(receiver, token->token());
  ASSERT_TRUE(redeemed.ok()) << redeemed.status();
  EXPECT_EQ(redeemed->tensor().tensor_id(), lease.tensor().tensor_id());
  Release(receiver, redeemed->lease_id());
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u) << "the receiver's lease was the last hold";
  EXPECT_EQ(broker_->GetStatus().host_bytes_in_use(), 0u);
}

TEST_F(HandOverTest, AnUnredeemedTokenExpiresAndLeavesNothing) {
  auto [sender, lease] = HeldBySender("ns/y");
  Delete(sender, "ns/y");
  auto token = HandOver(sender, lease.lease_id(), /*ttl_ms=*/30);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->ttl_ms(), 30u);
  broker_->CloseSession(sender);
  EXPECT_TRUE(TensorsGone()) << "the tensor outlived its hand-over's TTL";
  v1::StatusResponse status = broker_->GetStatus();
  EXPECT_EQ(status.hand_overs_pending(), 0u);
  EXPECT_EQ(status.host_bytes_in_use(), 0u);
  EXPECT_EQ(Redeem(Open(), token->token()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(HandOverTest, OnlyAPublishedTensorOfALeaseTheSessionHoldsIsHandedOver) {
  uint64_t producer = Open();
  auto allocated = Allocate(producer, "ns", 16);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  auto creating = HandOver(producer, allocated->lease_id());
  EXPECT_EQ(creating.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(creating.status().message().find("not published"), std::string::npos) << creating.status();

  auto [sender, lease] = HeldBySender("ns/z");
  EXPECT_EQ(HandOver(Open(), lease.lease_id()).status().code(), absl::StatusCode::kNotFound)
      << "another session's lease";
  auto too_long = HandOver(sender, lease.lease_id(), 3600 * 1000 + 1);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(broker_->GetStatus().hand_overs_pending(), 0u);
}

TEST_F(HandOverTest, ARedeemerThatMayNotReadTheTensorIsRefusedAndTheTokenStays) {
  auto [sender, lease] = HeldBySender("private/w");  // no ACL: only this uid may read it
  auto token = HandOver(sender, lease.lease_id());
  ASSERT_TRUE(token.ok()) << token.status();
  auto refused = Redeem(Open(kReader), token->token());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(broker_->GetStatus().hand_overs_pending(), 1u);
  EXPECT_TRUE(Redeem(Open(), token->token()).ok());
}

TEST_F(HandOverTest, AnotherUidThatMayReadRedeemsIt) {
  auto [sender, lease] = HeldBySender("shared/v");
  auto token = HandOver(sender, lease.lease_id());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_TRUE(Redeem(Open(kReader), token->token()).ok());
}

TEST_F(HandOverTest, PendingHandOversPerUidAndRedeemersLeasesAreCapped) {
  Start([](BrokerOptions& options) { options.max_leases_per_session = 2; });
  auto [sender, lease] = HeldBySender("ns/capped");
  auto first = HandOver(sender, lease.lease_id());
  auto second = HandOver(sender, lease.lease_id());
  ASSERT_TRUE(first.ok() && second.ok());
  auto third = HandOver(sender, lease.lease_id());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--max-leases-per-session 2"), std::string::npos) << third.status();

  // A receiver with no room for a lease is refused; the token stays for later.
  uint64_t receiver = Open();
  ASSERT_TRUE(Acquire(receiver, "ns/capped").ok());
  ASSERT_TRUE(Acquire(receiver, "ns/capped").ok());
  EXPECT_EQ(Redeem(receiver, first->token()).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Redeem(Open(), first->token()).ok());
  EXPECT_TRUE(HandOver(sender, lease.lease_id()).ok()) << "a redeemed hand-over no longer counts";
}

// A million tokens on one lease held about 510 MB of the daemon's memory for an hour.
TEST_F(HandOverTest, PendingHandOversPerLeaseAreCapped) {
  auto [sender, lease] = HeldBySender("ns/many");
  for (size_t i = 0; i < kMaxHandOversPerLease; ++i) ASSERT_TRUE(HandOver(sender, lease.lease_id()).ok()) << i;
  auto over = HandOver(sender, lease.lease_id());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find(absl::StrCat("the most one lease may have (", kMaxHandOversPerLease)),
            std::string::npos)
      << over.status();
  // Another lease of the same session has its own count.
  auto other = Acquire(sender, "ns/many");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(HandOver(sender, other->lease_id()).ok());
}

TEST(HandOverTableTest, CountsPerUidAndLeaseAndRemovesOnce) {
  HandOverTable table;
  table.Add("a", PendingHandOver{1, 10, 100, 7});
  table.Add("b", PendingHandOver{2, 10, 101, 8});
  table.Add("c", PendingHandOver{2, 11, 102, 8});
  EXPECT_EQ(table.size(), 3u);
  EXPECT_EQ(table.CountFor(10), 2u);
  EXPECT_EQ(table.CountFor(12), 0u);
  EXPECT_EQ(table.CountForLease(8), 2u);
  EXPECT_EQ(table.CountForLease(9), 0u);
  ASSERT_NE(table.Find("b"), nullptr);
  EXPECT_EQ(table.Find("b")->tensor_id, 2u);
  std::optional<PendingHandOver> removed = table.Remove("b");
  ASSERT_TRUE(removed.has_value());
  EXPECT_EQ(removed->timer_id, 101u);
  EXPECT_FALSE(table.Remove("b").has_value());
  EXPECT_EQ(table.Find("b"), nullptr);
  EXPECT_EQ(table.CountFor(10), 1u);
  EXPECT_EQ(table.CountForLease(8), 1u);
  EXPECT_EQ(table.size(), 2u);
}

}  // namespace
}  // namespace tensord::server
