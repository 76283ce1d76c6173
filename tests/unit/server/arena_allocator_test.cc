#include "server/placement/arena_allocator.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/memory/arena.h"

namespace tensord::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class FakeBuffer final : public common::BackendBuffer {
 public:
  explicit FakeBuffer(uint64_t size) : size_(size) {}
  uint64_t size() const override { return size_; }
  // Arena placement never shares a buffer.
  absl::StatusOr<common::MemoryHandle> Export() const override { return absl::UnimplementedError("not shared"); }
  absl::Status CheckShareable(const std::string&) const override { return absl::UnimplementedError("not shared"); }

 private:
  uint64_t size_;
};

constexpr uint64_t kArenaBytes = kFirstArenaBytes * 8;

class ArenaAllocatorTest : public ::testing::Test {
 protected:
  ArenaAllocatorTest() { session_.id = 7; }

  // Makes the session's next arena in `ns` for a slot of `slot_bytes`, as the broker does.
  uint64_t AddNextArena(const std::string& ns, uint64_t slot_bytes = ArenaAlignment()) {
    uint64_t bytes = allocator_.NextArenaBytes(registry_, session_, ns, slot_bytes);
    allocator_.AddArena(registry_, session_, ns, bytes, std::make_unique<FakeBuffer>(bytes));
    return bytes;
  }

  Tensor SmallTensor(const std::string& ns, uint64_t extent) {
    Tensor tensor;
    tensor.ns = ns;
    tensor.layout.extent = extent;
    return tensor;
  }

  ArenaAllocator allocator_{kArenaBytes};
  TensorRegistry registry_;
  Session session_;
};

TEST_F(ArenaAllocatorTest, ArenasDoubleFromTheFirstSizeUpToTheLimit) {
  std::vector<uint64_t> sizes;
  for (int k = 0; k < 6; ++k) sizes.push_back(AddNextArena("ns"));
  EXPECT_THAT(sizes, ElementsAre(kFirstArenaBytes, 2 * kFirstArenaBytes, 4 * kFirstArenaBytes, kArenaBytes,
                                 kArenaBytes, kArenaBytes));
  // Each namespace starts over.
  EXPECT_EQ(AddNextArena("other"), kFirstArenaBytes);
  EXPECT_EQ(session_.arenas["ns"].size(), 6u);
}

TEST_F(ArenaAllocatorTest, AFirstSlotLargerThanTheFirstSizeGetsAnArenaItFits) {
  EXPECT_EQ(AddNextArena("ns", 3 * kFirstArenaBytes), 4 * kFirstArenaBytes);
  // Never more than --arena-bytes, which no slot passes.
  EXPECT_EQ(allocator_.NextArenaBytes(registry_, session_, "fresh", kArenaBytes), kArenaBytes);
}

TEST_F(ArenaAllocatorTest, PlacesTensorsInTheSessionsArenasOfTheirNamespace) {
  Tensor none = SmallTensor("ns", 100);
  EXPECT_FALSE(allocator_.PlaceInArena(registry_, session_, none));
  AddNextArena("ns");
  uint64_t arena_id = session_.arenas["ns"][0];
  Tensor first = SmallTensor("ns", 100);
  ASSERT_TRUE(allocator_.PlaceInArena(registry_, session_, first));
  EXPECT_EQ(first.buffer_id, arena_id);
  EXPECT_EQ(first.offset, 0u);
  EXPECT_EQ(first.slot_bytes, ArenaAlignment());
  Tensor second = SmallTensor("ns", ArenaAlignment() + 1);
  ASSERT_TRUE(allocator_.PlaceInArena(registry_, session_, second));
  EXPECT_EQ(second.offset, ArenaAlignment());
  EXPECT_EQ(second.slot_bytes, 2 * ArenaAlignment());
  Tensor elsewhere = SmallTensor("other", 100);
  EXPECT_FALSE(allocator_.PlaceInArena(registry_, session_, elsewhere));
  // A slot larger than the room left is not placed.
  Tensor too_big = SmallTensor("ns", kFirstArenaBytes);
  EXPECT_FALSE(allocator_.PlaceInArena(registry_, session_, too_big));
}

TEST_F(ArenaAllocatorTest, AClosingSessionsEmptyArenasGoAtOnceTheOthersLater) {
  AddNextArena("ns");
  AddNextArena("ns");
  uint64_t used = session_.arenas["ns"][0];
  uint64_t empty = session_.arenas["ns"][1];
  Tensor tensor = SmallTensor("ns", 100);
  ASSERT_TRUE(allocator_.PlaceInArena(registry_, session_, tensor));
  ASSERT_EQ(tensor.buffer_id, used);
  tensor.id = registry_.NextTensorId();
  registry_.AddTensor(std::move(tensor));
  std::vector<std::unique_ptr<common::BackendBuffer>> released = allocator_.ReleaseArenas(registry_, session_);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0]->size(), 2 * kFirstArenaBytes);
  EXPECT_EQ(registry_.FindBuffer(empty), nullptr);
  ASSERT_NE(registry_.FindBuffer(used), nullptr);
  EXPECT_EQ(registry_.FindBuffer(used)->arena_owner, 0u);
  EXPECT_TRUE(session_.arenas.empty());
}

TEST_F(ArenaAllocatorTest, AllocationsQueueBehindTheArenaBeingMadeInOrder) {
  EXPECT_FALSE(allocator_.Making(7, "ns"));
  allocator_.StartMaking(7, "ns");
  EXPECT_TRUE(allocator_.Making(7, "ns"));
  EXPECT_FALSE(allocator_.Making(7, "other"));
  EXPECT_FALSE(allocator_.Making(8, "ns"));
  for (uint64_t extent : {1, 2, 3}) allocator_.Enqueue(7, "ns", QueuedAllocate{SmallTensor("ns", extent), nullptr});
  std::vector<QueuedAllocate> queued = allocator_.FinishMaking(7, "ns");
  ASSERT_EQ(queued.size(), 3u);
  EXPECT_EQ(queued[0].tensor.layout.extent, 1u);
  EXPECT_EQ(queued[2].tensor.layout.extent, 3u);
  EXPECT_FALSE(allocator_.Making(7, "ns"));
  // An arena made with nothing queued behind it.
  allocator_.StartMaking(7, "ns");
  EXPECT_THAT(allocator_.FinishMaking(7, "ns"), IsEmpty());
}

}  // namespace
}  // namespace tensord::server
