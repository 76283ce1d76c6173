#include "server/state/lease_table.h"

#include "gtest/gtest.h"

namespace tensord::server {
namespace {

constexpr uid_t kUid = 2001;

// A registry with one tensor, a uid quota and two sessions of kUid.
class LeaseTableTest : public ::testing::Test {
 protected:
  LeaseTableTest() : quota_(UidLimits{}, {}), table_(registry_, quota_) {
    Tensor tensor;
    tensor.id = registry_.NextTensorId();
    tensor_id_ = registry_.AddTensor(std::move(tensor)).id;
    first_.id = 1;
    second_.id = 2;
    first_.creds.uid = second_.creds.uid = kUid;
  }
  Tensor& tensor() { return *registry_.Find(tensor_id_); }
  uint64_t MetadataBytes() const { return quota_.InUse(kUid, UidResource::kMetadataBytes); }

  TensorRegistry registry_;
  UidQuota quota_;
  LeaseTable table_;
  uint64_t tensor_id_ = 0;
  Session first_, second_;
};

TEST_F(LeaseTableTest, AGrantIsSeenEverywhereAndADropUndoesAllOfIt) {
  const uint64_t lease = table_.Grant(first_, tensor(), /*by_name=*/true);
  EXPECT_EQ(tensor().leases, 1u);
  EXPECT_EQ(tensor().holders.at(first_.id), 1u);
  EXPECT_TRUE(tensor().name_holders.contains(first_.id));
  EXPECT_EQ(table_.CountOf(first_.id), 1u);
  EXPECT_EQ(first_.leases_granted, 1u);
  EXPECT_EQ(MetadataBytes(), kLeaseEntryBytes);

  Tensor* dropped = table_.Drop(first_, lease);
  ASSERT_NE(dropped, nullptr);
  EXPECT_EQ(dropped->id, tensor_id_);
  EXPECT_EQ(tensor().leases, 0u);
  EXPECT_TRUE(tensor().holders.empty());
  EXPECT_TRUE(tensor().name_holders.empty());
  EXPECT_EQ(table_.CountOf(first_.id), 0u);
  EXPECT_EQ(first_.leases_granted, 1u);  // a count of grants, not of leases held
  EXPECT_EQ(MetadataBytes(), 0u);
  EXPECT_EQ(table_.size(), 0u);
}

TEST_F(LeaseTableTest, OnlyTheHoldingSessionCanDropALeaseAndOnlyOnce) {
  const uint64_t lease = table_.Grant(first_, tensor());
  EXPECT_EQ(table_.Drop(second_, lease), nullptr);
  EXPECT_EQ(table_.Find(lease, second_.id), nullptr);
  ASSERT_NE(table_.Find(lease, first_.id), nullptr);
  EXPECT_EQ(tensor().leases, 1u);
  EXPECT_NE(table_.Drop(first_, lease), nullptr);
  EXPECT_EQ(table_.Drop(first_, lease), nullptr);
  EXPECT_EQ(tensor().leases, 0u);
}

TEST_F(LeaseTableTest, ASessionsSecondLeaseOnATensorKeepsItAHolder) {
  const uint64_t a = table_.Grant(first_, tensor());
  table_.Grant(first_, tensor());
  table_.Grant(second_, tensor());
  EXPECT_EQ(tensor().holders.at(first_.id), 2u);
  table_.Drop(first_, a);
  EXPECT_EQ(tensor().holders.at(first_.id), 1u);
  EXPECT_EQ(tensor().leases, 2u);
}

TEST_F(LeaseTableTest, DropAllDropsEveryLeaseOfOneSessionOnly) {
  table_.Grant(first_, tensor());
  table_.Grant(first_, tensor(), /*by_name=*/true);
  const uint64_t kept = table_.Grant(second_, tensor());
  const std::vector<uint64_t> tensors = table_.DropAll(first_);
  EXPECT_EQ(tensors, (std::vector<uint64_t>{tensor_id_, tensor_id_}));
  EXPECT_EQ(table_.CountOf(first_.id), 0u);
  EXPECT_FALSE(tensor().holders.contains(first_.id));
  EXPECT_FALSE(tensor().name_holders.contains(first_.id));
  EXPECT_EQ(tensor().leases, 1u);
  EXPECT_NE(table_.Find(kept, second_.id), nullptr);
  EXPECT_EQ(MetadataBytes(), kLeaseEntryBytes);
  EXPECT_TRUE(table_.DropAll(first_).empty());
}

TEST_F(LeaseTableTest, IdsAreNeverReused) {
  const uint64_t first = table_.Grant(first_, tensor());
  ASSERT_NE(table_.Drop(first_, first), nullptr);
  EXPECT_NE(table_.Grant(first_, tensor()), first);
}

}  // namespace
}  // namespace tensord::server
