// ConnectionLimits and UidQuota on their own: caps per uid and in all, exempt uids, all or
// nothing, and messages that name the flag.
#include "server/access/connection_limits.h"

#include <string>

#include "gtest/gtest.h"
#include "server/access/uid_quota.h"

namespace tensord::server {
namespace {

TEST(ConnectionLimitsTest, CapsPerUidAndInAllButNotForExemptUids) {
  ConnectionLimits limits("fd channel", ConnectionCaps{5, "--max-things", 2, {0}});
  EXPECT_TRUE(limits.Admit(1000).ok());
  EXPECT_TRUE(limits.Admit(1000).ok());
  absl::Status third = limits.Admit(1000);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(third.message()).find("uid 1000 has 2 connections open"), std::string::npos) << third;
  EXPECT_NE(std::string(third.message()).find("--max-connections-per-uid 2"), std::string::npos) << third;
  EXPECT_TRUE(limits.CheckRoom(1001).ok());
  EXPECT_EQ(limits.of_uid(1000), 2u) << "a refusal counts nothing";
  // Root is exempt from the per-uid cap, never from the total.
  EXPECT_TRUE(limits.Admit(0).ok());
  EXPECT_TRUE(limits.Admit(0).ok());
  EXPECT_TRUE(limits.Admit(0).ok());
  absl::Status full = limits.Admit(0);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(full.message()).find("(--max-things 5)"), std::string::npos) << full;
  limits.Leave(1000);
  EXPECT_TRUE(limits.Admit(1000).ok());
  EXPECT_EQ(limits.total(), 5u);
}

TEST(UidQuotaTest, ReservesAllOrNothingAndReleasesExactly) {
  UidLimits limits;
  limits[UidResource::kMetadataBytes] = 1000;
  UidQuota quota(limits, {0});
  EXPECT_TRUE(quota.Reserve(7, UidResource::kMetadataBytes, 600, "x").ok());
  absl::Status over = quota.Reserve(7, UidResource::kMetadataBytes, 401, "tagging");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(over.message()).find("tagging needs 401 more"), std::string::npos) << over;
  EXPECT_NE(std::string(over.message()).find("uid 7 holds 600"), std::string::npos) << over;
  EXPECT_NE(std::string(over.message()).find("(--max-metadata-bytes-per-uid 1000)"), std::string::npos) << over;
  EXPECT_EQ(quota.InUse(7, UidResource::kMetadataBytes), 600u);
  EXPECT_TRUE(quota.Reserve(7, UidResource::kMetadataBytes, 400, "x").ok());
  // A limit of 0 is none; exempt uids are counted but never refused.
  EXPECT_TRUE(quota.Reserve(7, UidResource::kTensors, 1'000'000, "x").ok());
  EXPECT_TRUE(quota.Reserve(0, UidResource::kMetadataBytes, 5000, "x").ok());
  EXPECT_EQ(quota.InUse(0, UidResource::kMetadataBytes), 5000u);
  quota.Release(7, UidResource::kMetadataBytes, 1000);
  quota.Release(7, UidResource::kTensors, 1'000'000);
  quota.Release(0, UidResource::kMetadataBytes, 5000);
  EXPECT_EQ(quota.uid_count(), 0u) << "a uid's entry goes once it holds nothing";
}

}  // namespace
}  // namespace tensord::server
