#include "server/memory/buffer_pool.h"

#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/server/sized_buffer.h"

namespace tensord::server {
namespace {

using testing::SizedBuffer;

const ResolvedDevice kHost{nullptr, {}, "host"};
const ResolvedDevice kGpu{nullptr, {}, "cuda:GPU-0"};

BufferPool::Entry Entry(uint64_t buffer_id, uint64_t session, uint64_t size, std::string ns = "ns",
                        const ResolvedDevice* device = &kHost) {
  return BufferPool::Entry{buffer_id, session, std::move(ns), device, size, true, {},
                           std::make_unique<SizedBuffer>(size)};
}

std::vector<uint64_t> Ids(const std::vector<BufferPool::Entry>& entries) {
  std::vector<uint64_t> ids;
  for (const BufferPool::Entry& entry : entries) ids.push_back(entry.buffer_id);
  return ids;
}

TEST(BufferPoolTest, TakesTheSmallestNamedFitWithinAQuarterMore) {
  BufferPool pool({8, 1 << 30});
  EXPECT_TRUE(pool.Put(Entry(1, 7, 4000)).empty());
  EXPECT_TRUE(pool.Put(Entry(2, 7, 5000)).empty());
  EXPECT_TRUE(pool.Put(Entry(3, 7, 4100)).empty());
  const std::vector<uint64_t> all = {1, 2, 3};
  // Only a buffer the caller names is handed out.
  EXPECT_FALSE(pool.Take(7, "ns", &kHost, 4000, std::vector<uint64_t>{}).has_value());
  EXPECT_FALSE(pool.Take(7, "ns", &kHost, 4000, std::vector<uint64_t>{99}).has_value());
  std::optional<BufferPool::Entry> taken = pool.Take(7, "ns", &kHost, 4050, all);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->buffer_id, 3u);
  EXPECT_EQ(taken->size, 4100u);
  ASSERT_NE(taken->memory, nullptr);
  // 5000 is more than a quarter above 3900.
  EXPECT_EQ(pool.Take(7, "ns", &kHost, 3900, all)->buffer_id, 1u);
  EXPECT_FALSE(pool.Take(7, "ns", &kHost, 3900, all).has_value());
  EXPECT_EQ(pool.size(), 1u);
  EXPECT_EQ(pool.bytes(), 5000u);
}

TEST(BufferPoolTest, ABufferServesOnlyItsSessionNamespaceAndDevice) {
  BufferPool pool({8, 1 << 30});
  pool.Put(Entry(1, 7, 4096));
  const std::vector<uint64_t> one = {1};
  EXPECT_FALSE(pool.Take(8, "ns", &kHost, 4096, one).has_value());
  EXPECT_FALSE(pool.Take(7, "other", &kHost, 4096, one).has_value());
  EXPECT_FALSE(pool.Take(7, "ns", &kGpu, 4096, one).has_value());
  EXPECT_FALSE(pool.Take(7, "ns", &kHost, 8192, one).has_value());
  EXPECT_TRUE(pool.Take(7, "ns", &kHost, 4096, one).has_value());
}

TEST(BufferPoolTest, ASessionsOldestGoWhenItsBoundsAreReached) {
  BufferPool pool({2, 10000});
  pool.Put(Entry(1, 7, 3000));
  pool.Put(Entry(2, 8, 3000));  // another session's: never evicted for session 7
  pool.Put(Entry(3, 7, 3000));
  EXPECT_EQ(Ids(pool.Put(Entry(4, 7, 3000))), std::vector<uint64_t>({1}));  // count bound
  EXPECT_EQ(Ids(pool.Put(Entry(5, 7, 7000))), std::vector<uint64_t>({3}));  // byte bound
  EXPECT_EQ(Ids(pool.Put(Entry(6, 7, 20000))), std::vector<uint64_t>({6}));  // alone too large
  EXPECT_EQ(pool.size(), 3u);  // 4 and 5 of session 7, 2 of session 8
  EXPECT_EQ(pool.bytes(), 13000u);
}

TEST(BufferPoolTest, PressureTakesTheOldestOfAnySessionOnTheDevice) {
  BufferPool pool({8, 1 << 30});
  pool.Put(Entry(1, 7, 1000));
  pool.Put(Entry(2, 8, 1000, "ns", &kGpu));
  pool.Put(Entry(3, 8, 1000));
  pool.Put(Entry(4, 7, 1000));
  EXPECT_EQ(Ids(pool.EvictOldest(&kHost, 1500)), std::vector<uint64_t>({1, 3}));
  EXPECT_EQ(Ids(pool.EvictOldest(&kHost, 1)), std::vector<uint64_t>({4}));
  EXPECT_TRUE(pool.EvictOldest(&kHost, 1).empty());
  EXPECT_EQ(pool.size(), 1u);
}

// Status reports pooled bytes per device: the host's and each GPU's are their own quota's.
TEST(BufferPoolTest, CountsPooledBytesPerDevice) {
  BufferPool pool({8, 1 << 30});
  pool.Put(Entry(1, 7, 1000));
  pool.Put(Entry(2, 7, 4000, "ns", &kGpu));
  pool.Put(Entry(3, 8, 2000, "ns", &kGpu));
  EXPECT_EQ(pool.bytes_on(&kHost), 1000u);
  EXPECT_EQ(pool.bytes_on(&kGpu), 6000u);
  ASSERT_TRUE(pool.Take(7, "ns", &kGpu, 4000, std::vector<uint64_t>{2}).has_value());
  EXPECT_EQ(pool.bytes_on(&kGpu), 2000u);
  EXPECT_EQ(Ids(pool.EvictOldest(&kGpu, 1)), std::vector<uint64_t>({3}));
  EXPECT_EQ(pool.bytes_on(&kGpu), 0u);
  EXPECT_EQ(pool.bytes(), 1000u);
}

TEST(BufferPoolTest, AClosingSessionTakesEverythingItPooled) {
  BufferPool pool({8, 1 << 30});
  pool.Put(Entry(1, 7, 1000));
  pool.Put(Entry(2, 8, 1000));
  pool.Put(Entry(3, 7, 1000));
  EXPECT_EQ(Ids(pool.RemoveSession(7)), std::vector<uint64_t>({1, 3}));
  EXPECT_TRUE(pool.RemoveSession(7).empty());
  EXPECT_EQ(pool.size(), 1u);
  EXPECT_EQ(pool.bytes(), 1000u);
}

TEST(BufferPoolTest, OffKeepsNothing) {
  BufferPool pool({8, 0});
  EXPECT_FALSE(pool.enabled());
  EXPECT_EQ(Ids(pool.Put(Entry(1, 7, 1000))), std::vector<uint64_t>({1}));
  EXPECT_EQ(pool.size(), 0u);
}

}  // namespace
}  // namespace tensord::server
