// Lease hand-overs in the Broker (broker_hand_over.cc) and their table (HandOverTable): a
// token is redeemed once, holds its tensor whatever becomes of its maker, expires leaving
// nothing, and is checked like an acquire.
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/protocol_limits.h"
#include "gtest/gtest.h"
#include "server/state/hand_over_table.h"
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

TEST(HandOverTableTest, PinsCountEachTensorOncePerUid) {
  HandOverTable table;
  table.Add("a", PendingHandOver{1, 10, 100, 7, 4096, true});
  table.Add("b", PendingHandOver{1, 10, 101, 8, 4096, true});  // the same tensor again
  table.Add("c", PendingHandOver{2, 10, 102, 8, 8192, false});
  table.Add("d", PendingHandOver{1, 11, 103, 9, 4096, true});  // another uid's
  EXPECT_TRUE(table.Pins(10, 1));
  EXPECT_FALSE(table.Pins(10, 3));
  HandOverPins pins = table.PinsOf(10);
  EXPECT_EQ(pins.hand_overs, 3u);
  EXPECT_EQ(pins.host_bytes, 4096u);
  EXPECT_EQ(pins.device_bytes, 8192u);
  EXPECT_EQ(table.TokensOf(11), std::vector<std::string>{"d"});
  ASSERT_TRUE(table.Remove("a").has_value());
  EXPECT_TRUE(table.Pins(10, 1)) << "b still pins tensor 1";
  EXPECT_EQ(table.PinsOf(10).host_bytes, 4096u);
  ASSERT_TRUE(table.Remove("b").has_value());
  EXPECT_FALSE(table.Pins(10, 1));
  EXPECT_EQ(table.PinsOf(10).host_bytes, 0u);
  ASSERT_TRUE(table.Remove("c").has_value());
  EXPECT_EQ(table.PinsOf(10).hand_overs, 0u);
  EXPECT_EQ(table.pins_by_uid().size(), 1u);
  EXPECT_TRUE(table.TokensOf(10).empty());
}

// A uid that may only read a namespace acquired its tensors, handed each over for an hour
// and exited: the owner deleted them, the memory stayed for the hour, charged to no one.
// Now what a pending hand-over pins counts against its maker's host quota.
class HandOverPinTest : public HandOverTest {
 protected:
  HandOverPinTest() {
    Start([](BrokerOptions& options) { options.uid_limits[UidResource::kHostBytes] = 2 * kBuffer; });
  }

  static constexpr uint64_t kBuffer = 4096;  // PublishNew's 64 bytes, in a page of its own

  // Leases of a new session of kReader on "shared/0" .. "shared/<count-1>", published by the daemon's uid.
  std::pair<uint64_t, std::vector<v1::AcquireResponse>> ReaderHolds(int count) {
    uint64_t producer = Open();
    for (int i = 0; i < count; ++i) PublishNew(producer, "shared/" + std::to_string(i));
    uint64_t reader = Open(kReader);
    std::vector<v1::AcquireResponse> leases;
    for (int i = 0; i < count; ++i) {
      auto lease = Acquire(reader, "shared/" + std::to_string(i));
      EXPECT_TRUE(lease.ok()) << lease.status();
      EXPECT_EQ(lease->tensor().buffer().size(), kBuffer);
      leases.push_back(*lease);
    }
    return {reader, leases};
  }

  v1::HandOverUsage PinnedBy(uid_t uid, uint64_t caller = 0) {
    v1::StatusResponse status = broker_->GetStatus({}, caller);
    for (const v1::HandOverUsage& usage : status.hand_over_usage()) {
      if (usage.uid() == uid) return usage;
    }
    return {};
  }

  absl::StatusOr<v1::CancelHandOversResponse> Cancel(uint64_t session, std::vector<std::string> tokens = {}) {
    v1::CancelHandOversRequest request;
    for (std::string& token : tokens) request.add_tokens(std::move(token));
    return broker_->CancelHandOvers(session, request);
  }
};

TEST_F(HandOverPinTest, AMakersPinsStopAtItsHostQuotaEachTensorCountedOnce) {
  auto [reader, leases] = ReaderHolds(3);
  auto first = HandOver(reader, leases[0].lease_id());
  auto again = HandOver(reader, leases[0].lease_id());  // the same memory: nothing more
  auto second = HandOver(reader, leases[1].lease_id());
  ASSERT_TRUE(first.ok() && again.ok() && second.ok()) << second.status();
  v1::HandOverUsage pinned = PinnedBy(kReader);
  EXPECT_EQ(pinned.hand_overs(), 3u);
  EXPECT_EQ(pinned.host_bytes(), 2 * kBuffer);

  auto third = HandOver(reader, leases[2].lease_id());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--max-host-bytes-per-uid"), std::string::npos) << third.status();
  EXPECT_NE(third.status().message().find("uid 4242"), std::string::npos) << third.status();
  EXPECT_EQ(broker_->GetStatus().hand_overs_pending(), 3u) << "a refused hand-over leaves nothing";

  // Redeeming one of two tokens on a tensor keeps its pin; redeeming the other ends it.
  uint64_t receiver = Open(kReader);
  auto redeemed = Redeem(receiver, first->token());
  ASSERT_TRUE(redeemed.ok()) << redeemed.status();
  EXPECT_EQ(PinnedBy(kReader).host_bytes(), 2 * kBuffer);
  EXPECT_EQ(HandOver(reader, leases[2].lease_id()).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(Redeem(receiver, again->token()).ok());
  EXPECT_EQ(PinnedBy(kReader).host_bytes(), kBuffer);
  EXPECT_TRUE(HandOver(reader, leases[2].lease_id()).ok()) << "the redeemed pin was given back";
}

TEST_F(HandOverPinTest, AnExpiredTokensPinGoesWithIt) {
  auto [reader, leases] = ReaderHolds(3);
  ASSERT_TRUE(HandOver(reader, leases[0].lease_id(), /*ttl_ms=*/30).ok());
  ASSERT_TRUE(HandOver(reader, leases[1].lease_id()).ok());
  EXPECT_EQ(HandOver(reader, leases[2].lease_id()).status().code(), absl::StatusCode::kResourceExhausted);
  for (int i = 0; i < 500 && broker_->GetStatus().hand_overs_pending() > 1; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(PinnedBy(kReader).host_bytes(), kBuffer);
  EXPECT_TRUE(HandOver(reader, leases[2].lease_id()).ok());
}

TEST_F(HandOverPinTest, AUidCancelsItsOwnTokensOnlyAndTheMemoryGoes) {
  auto [reader, leases] = ReaderHolds(2);
  auto first = HandOver(reader, leases[0].lease_id(), 3600 * 1000);
  auto second = HandOver(reader, leases[1].lease_id(), 3600 * 1000);
  ASSERT_TRUE(first.ok() && second.ok());
  // The owner's own token, which the reader may not cancel.
  uint64_t owner = Open();
  auto owners_lease = Acquire(owner, "shared/0");
  ASSERT_TRUE(owners_lease.ok());
  auto owners = HandOver(owner, owners_lease->lease_id());
  ASSERT_TRUE(owners.ok());
  broker_->CloseSession(reader);  // the reader exits: its tokens stay, pinned to its uid
  Delete(owner, "shared/0");
  Delete(owner, "shared/1");
  Release(owner, owners_lease->lease_id());
  EXPECT_EQ(broker_->GetStatus().tensors(), 2u);

  uint64_t later = Open(kReader);  // another process of the same uid
  // Only its own uid's pins show to it.
  v1::StatusResponse seen = broker_->GetStatus({}, later);
  ASSERT_EQ(seen.hand_over_usage_size(), 1);
  EXPECT_EQ(seen.hand_over_usage(0).uid(), kReader);
  EXPECT_EQ(broker_->GetStatus({}, owner).hand_over_usage_size(), 2) << "the daemon's uid sees every uid";

  auto by_token = Cancel(later, {first->token(), owners->token(), "not-a-token"});
  ASSERT_TRUE(by_token.ok()) << by_token.status();
  EXPECT_EQ(by_token->cancelled(), 1u);
  EXPECT_EQ(by_token->not_found(), 2u) << "another uid's token is not found, as a made-up one";
  EXPECT_EQ(PinnedBy(kReader).host_bytes(), kBuffer);
  auto all = Cancel(later);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->cancelled(), 1u);
  EXPECT_EQ(PinnedBy(kReader).hand_overs(), 0u);
  EXPECT_EQ(broker_->GetStatus().hand_overs_pending(), 1u) << "the owner's token stays";
  EXPECT_EQ(broker_->GetStatus().tensors(), 1u) << "shared/1, held by the reader's token only, went";
  EXPECT_TRUE(Redeem(Open(), owners->token()).ok());

  std::vector<std::string> too_many(common::kMaxCancelHandOversBatch + 1, "x");
  EXPECT_EQ(Cancel(later, too_many).status().code(), absl::StatusCode::kInvalidArgument);
}

// A uid's own buffer (outside every ACL'd namespace) counts against it already: handing
// its tensor over pins nothing more.
TEST_F(HandOverPinTest, AProducersOwnChargedBufferIsNotChargedTwice) {
  uint64_t maker = Open(kReader);
  std::vector<v1::AcquireResponse> leases;
  for (int i = 0; i < 2; ++i) {
    auto allocated = Allocate(maker, "", 16);  // no namespace: its buffer counts against kReader
    ASSERT_TRUE(allocated.ok()) << allocated.status();
    Seal(maker, *allocated);
    v1::PublishRequest publish;
    publish.set_tensor_id(allocated->tensor().tensor_id());
    ASSERT_TRUE(broker_->Publish(maker, publish).ok());
    leases.push_back(v1::AcquireResponse());
    leases.back().set_lease_id(allocated->lease_id());
  }
  for (const v1::AcquireResponse& lease : leases) ASSERT_TRUE(HandOver(maker, lease.lease_id()).ok());
  EXPECT_EQ(PinnedBy(kReader).host_bytes(), 2 * kBuffer) << "what the tokens hold alive";
}

}  // namespace
}  // namespace tensord::server
