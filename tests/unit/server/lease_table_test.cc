#include "server/state/lease_table.h"

#include "gtest/gtest.h"

namespace tensord::server {
namespace {

TEST(LeaseTable, OnlyTheHoldingSessionCanRemoveALease) {
  LeaseTable table;
  uint64_t lease = table.Add(/*session_id=*/1, /*tensor_id=*/7);
  EXPECT_FALSE(table.Remove(lease, /*session_id=*/2).has_value());
  EXPECT_EQ(table.size(), 1u);
  std::optional<Lease> removed = table.Remove(lease, 1);
  ASSERT_TRUE(removed.has_value());
  EXPECT_EQ(removed->tensor_id, 7u);
  EXPECT_FALSE(table.Remove(lease, 1).has_value());  // never twice
  EXPECT_EQ(table.size(), 0u);
}

TEST(LeaseTable, IdsAreNeverReused) {
  LeaseTable table;
  uint64_t first = table.Add(1, 1);
  ASSERT_TRUE(table.Remove(first, 1).has_value());
  EXPECT_NE(table.Add(1, 1), first);
}

}  // namespace
}  // namespace tensord::server
