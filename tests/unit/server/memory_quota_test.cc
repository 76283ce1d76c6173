#include "server/memory/memory_quota.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensord::server {
namespace {

using ::testing::HasSubstr;

constexpr std::string_view kGpu = "cuda:GPU-0a1b2c3d";

TEST(MemoryQuotaTest, ReservesUpToTheLimitAndReleases) {
  MemoryQuota quota;
  quota.SetLimit(MemoryQuota::kHost, 8192, "--max-host-bytes");
  EXPECT_EQ(quota.Limit(MemoryQuota::kHost), 8192u);
  ASSERT_TRUE(quota.Reserve(MemoryQuota::kHost, 4096, "a").ok());
  ASSERT_TRUE(quota.Reserve(MemoryQuota::kHost, 4096, "b").ok());
  EXPECT_EQ(quota.InUse(MemoryQuota::kHost), 8192u);
  EXPECT_EQ(quota.Reserve(MemoryQuota::kHost, 1, "c").code(), absl::StatusCode::kResourceExhausted);
  quota.Release(MemoryQuota::kHost, 4096);
  EXPECT_EQ(quota.InUse(MemoryQuota::kHost), 4096u);
  EXPECT_TRUE(quota.Reserve(MemoryQuota::kHost, 4096, "d").ok());
}

TEST(MemoryQuotaTest, HostRefusalKeepsItsMessageAndReservesNothing) {
  MemoryQuota quota;
  quota.SetLimit(MemoryQuota::kHost, 10000, "--max-host-bytes");
  ASSERT_TRUE(quota.Reserve(MemoryQuota::kHost, 4096, "first").ok());
  absl::Status refused = quota.Reserve(MemoryQuota::kHost, 8192, "exporting a memfd");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(),
            "exporting a memfd needs 8192 bytes (8.0 KiB) of host memory: 4096 bytes (4.0 KiB) are in use "
            "of the limit of 10000 bytes (9.8 KiB) (--max-host-bytes)");
  EXPECT_EQ(quota.InUse(MemoryQuota::kHost), 4096u);
  // More than the whole limit: refused without overflow, whatever is in use.
  EXPECT_EQ(quota.Reserve(MemoryQuota::kHost, UINT64_MAX, "huge").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(quota.InUse(MemoryQuota::kHost), 4096u);
}

TEST(MemoryQuotaTest, DevicesAreIndependentAndNamedInRefusals) {
  MemoryQuota quota;
  quota.SetLimit(MemoryQuota::kHost, 4096, "--max-host-bytes");
  quota.SetLimit(kGpu, 1 << 20, "--max-device-bytes");
  ASSERT_TRUE(quota.Reserve(MemoryQuota::kHost, 4096, "host").ok());
  ASSERT_TRUE(quota.Reserve(kGpu, 1 << 20, "gpu").ok());
  EXPECT_EQ(quota.InUse(MemoryQuota::kHost), 4096u);
  EXPECT_EQ(quota.InUse(kGpu), 1u << 20);
  absl::Status refused = quota.Reserve(kGpu, 4096, "allocating a tensor");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(),
            "allocating a tensor needs 4096 bytes (4.0 KiB) of memory on cuda:GPU-0a1b2c3d: 1048576 bytes "
            "(1.0 MiB) are in use of the limit of 1048576 bytes (1.0 MiB) (--max-device-bytes)");
  // Releasing one device frees nothing on the other.
  quota.Release(MemoryQuota::kHost, 4096);
  EXPECT_EQ(quota.InUse(kGpu), 1u << 20);
  EXPECT_EQ(quota.Reserve(kGpu, 4096, "again").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(quota.Reserve(MemoryQuota::kHost, 4096, "host again").ok());
}

TEST(MemoryQuotaTest, AKeyWithoutALimitHasNoMemory) {
  MemoryQuota quota;
  EXPECT_EQ(quota.Limit(kGpu), 0u);
  EXPECT_EQ(quota.InUse(kGpu), 0u);
  EXPECT_TRUE(quota.Reserve(kGpu, 0, "nothing").ok());
  absl::Status refused = quota.Reserve(kGpu, 4096, "allocating a tensor");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("cuda:GPU-0a1b2c3d"));
}

TEST(MemoryQuotaDeathTest, ReleasingMoreThanIsInUseCrashes) {
  MemoryQuota quota;
  quota.SetLimit(MemoryQuota::kHost, 8192, "--max-host-bytes");
  ASSERT_TRUE(quota.Reserve(MemoryQuota::kHost, 4096, "a").ok());
  EXPECT_DEATH(quota.Release(MemoryQuota::kHost, 8192), "invariant broken");
}

}  // namespace
}  // namespace tensord::server
