// AllocationPool's decisions: which specs are pooled, in which class, when it refills and
// by how much, and what it gives back.
#include "client/allocation_pool.h"

#include <unistd.h>

#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensord::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

const uint64_t kPage = std::max<uint64_t>(4096, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));

AllocationPool::Entry InArena(uint64_t lease_id, bool arena = true) {
  AllocationPool::Entry entry;
  entry.lease_id = lease_id;
  entry.tensor.mutable_buffer()->set_arena(arena);
  return entry;
}

TEST(AllocationPoolTest, ClassesArePowerOfTwoPagesOfSmallHostTensorsInANamespace) {
  TensorSpec spec;
  EXPECT_EQ(AllocationPool::ClassBytes("ns", spec, 1), kPage);
  EXPECT_EQ(AllocationPool::ClassBytes("ns", spec, kPage), kPage);
  EXPECT_EQ(AllocationPool::ClassBytes("ns", spec, kPage + 1), 2 * kPage);
  EXPECT_EQ(AllocationPool::ClassBytes("ns", spec, 2 * kPage + 1), 4 * kPage);  // 3 pages
  if (kPage == 4096) {
    EXPECT_EQ(AllocationPool::ClassBytes("ns", spec, 64 << 10), 64u << 10);
    EXPECT_EQ(AllocationPool::ClassBytes("ns", spec, (64 << 10) + 1), 0u);
  }
  EXPECT_EQ(AllocationPool::ClassBytes("ns", spec, 0), 0u);  // zero-byte: no buffer at all
  EXPECT_EQ(AllocationPool::ClassBytes("", spec, 64), 0u);
  TensorSpec isolated;
  isolated.isolated = true;
  EXPECT_EQ(AllocationPool::ClassBytes("ns", isolated, 64), 0u);
  TensorSpec tagged;
  tagged.tags["k"] = "v";
  EXPECT_EQ(AllocationPool::ClassBytes("ns", tagged, 64), 0u);
  TensorSpec gpu;
  gpu.device = DLDevice{kDLCUDA, 0};
  EXPECT_EQ(AllocationPool::ClassBytes("ns", gpu, 64), 0u);
}

TEST(AllocationPoolTest, AClassIsPooledOnlyAfterAPlainAllocateAndRefillsDouble) {
  AllocationPool pool;
  AllocationPool::Next next = pool.Take("ns", kPage);
  EXPECT_FALSE(next.entry.has_value());
  EXPECT_EQ(next.refill, 0u);  // never allocated: a plain Allocate
  pool.NoteAllocated("ns", kPage);
  EXPECT_EQ(pool.Take("other", kPage).refill, 0u);
  EXPECT_EQ(pool.Take("ns", 2 * kPage).refill, 0u);

  EXPECT_EQ(pool.Take("ns", kPage).refill, 2u);
  std::vector<uint64_t> release;
  std::optional<AllocationPool::Entry> mine = pool.Refill("ns", kPage, {InArena(1), InArena(2)}, release);
  ASSERT_TRUE(mine.has_value());
  EXPECT_EQ(mine->lease_id, 1u);
  EXPECT_THAT(release, IsEmpty());
  next = pool.Take("ns", kPage);
  ASSERT_TRUE(next.entry.has_value());
  EXPECT_EQ(next.entry->lease_id, 2u);
  // Empty again: each refill of the class is twice the last, up to the cap.
  std::vector<size_t> sizes;
  for (int i = 0; i < 8; ++i) sizes.push_back(pool.Take("ns", kPage).refill);
  const size_t cap = std::min<uint64_t>(64, (256 << 10) / kPage);
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(sizes[i], std::min<size_t>(cap, size_t{4} << i)) << i;
  }
}

TEST(AllocationPoolTest, AnEntryOutsideAnArenaEndsPoolingOfItsClassAndIsGivenBack) {
  AllocationPool pool;
  pool.NoteAllocated("ns", kPage);
  ASSERT_EQ(pool.Take("ns", kPage).refill, 2u);
  std::vector<uint64_t> release;
  EXPECT_TRUE(pool.Refill("ns", kPage, {InArena(1), InArena(2), InArena(3)}, release).has_value());
  // Another refill of the class, at the same time, got dedicated buffers.
  EXPECT_FALSE(pool.Refill("ns", kPage, {InArena(4, false), InArena(5, false)}, release).has_value());
  EXPECT_THAT(release, UnorderedElementsAre(2, 3, 4, 5));
  AllocationPool::Next next = pool.Take("ns", kPage);
  EXPECT_FALSE(next.entry.has_value());
  EXPECT_EQ(next.refill, 0u);
  // A refill still in flight when that happened keeps only its caller's entry.
  release.clear();
  std::optional<AllocationPool::Entry> late = pool.Refill("ns", kPage, {InArena(6), InArena(7)}, release);
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->lease_id, 6u);
  EXPECT_THAT(release, ElementsAre(7));
}

TEST(AllocationPoolTest, AFailedRefillGivesNothingAndKeepsTheClassPooled) {
  AllocationPool pool;
  pool.NoteAllocated("ns", kPage);
  ASSERT_EQ(pool.Take("ns", kPage).refill, 2u);
  std::vector<uint64_t> release;
  EXPECT_FALSE(pool.Refill("ns", kPage, {}, release).has_value());
  EXPECT_THAT(release, IsEmpty());
  EXPECT_EQ(pool.Take("ns", kPage).refill, 4u);
}

TEST(AllocationPoolTest, TakeAllEmptiesEveryClassOfOneNamespaceOnly) {
  AllocationPool pool;
  std::vector<uint64_t> release;
  for (const char* ns : {"a", "ab", "b"}) {
    for (uint64_t bytes : {kPage, 2 * kPage}) {
      pool.NoteAllocated(ns, bytes);
      ASSERT_EQ(pool.Take(ns, bytes).refill, 2u);
      const uint64_t base = (ns[0] == 'a' ? 10 : 30) + (ns[1] == 'b' ? 100 : 0) + bytes / kPage * 2;
      ASSERT_TRUE(pool.Refill(ns, bytes, {InArena(base), InArena(base + 1)}, release).has_value());
    }
  }
  EXPECT_THAT(pool.TakeAll("a"), UnorderedElementsAre(13, 15));
  EXPECT_THAT(pool.TakeAll("a"), IsEmpty());
  EXPECT_FALSE(pool.Take("a", kPage).entry.has_value());
  EXPECT_TRUE(pool.Take("ab", kPage).entry.has_value());
  EXPECT_THAT(pool.TakeAll("b"), UnorderedElementsAre(33, 35));
  EXPECT_THAT(release, IsEmpty());
}

}  // namespace
}  // namespace tensord::internal
