#include "server/placement/placement.h"

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/memory/arena.h"
#include "tests/unit/server/sized_buffer.h"

namespace tensord::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using testing::SizedBuffer;

const ResolvedDevice kHost{nullptr, {}, "host"};
const ResolvedDevice kGpu{nullptr, {}, "cuda:GPU-0"};
constexpr uint64_t kArenaBytes = kFirstArenaBytes * 8;
constexpr uint64_t kArenaMaxTensor = kFirstArenaBytes;

Placement::Request Wants(bool isolated, bool recyclable, std::span<const uint64_t> maps = {}) {
  Placement::Request request;
  request.isolated = isolated;
  request.recyclable = recyclable;
  request.reuse_buffer_ids = maps;
  return request;
}

class PlacementTest : public ::testing::Test {
 protected:
  PlacementTest() { session_.id = 7; }

  Tensor Make(const std::string& ns, uint64_t extent, const ResolvedDevice* device = &kHost) {
    Tensor tensor;
    tensor.ns = ns;
    tensor.device = device;
    tensor.layout.extent = extent;
    return tensor;
  }
  // As the broker asks: InArena once, then where.
  Placement::Choice Choose(Tensor& tensor, Placement::Request request = {}) {
    if (placement_.InArena(tensor, request)) return placement_.ChooseArena(registry_, session_, tensor);
    return placement_.ChooseBuffer(session_, tensor, request, tensor.layout.extent);
  }
  // Allocations of `ns` that waited for an arena, one per extent, in order.
  std::vector<QueuedAllocate> Waiting(const std::string& ns, std::initializer_list<uint64_t> extents) {
    std::vector<QueuedAllocate> batch;
    for (uint64_t extent : extents) batch.push_back(QueuedAllocate{Make(ns, extent), {}});
    return batch;
  }
  void AddArena(const std::string& ns, uint64_t bytes) {
    arenas_.AddArena(registry_, session_, ns, bytes, std::make_unique<SizedBuffer>(bytes));
  }

  TensorRegistry registry_;
  Session session_;
  ArenaAllocator arenas_{kArenaBytes};
  BufferPool pool_{BufferPool::Limits{16, uint64_t{1} << 30}};
  Placement placement_{{kArenaBytes, kArenaMaxTensor}, &kHost, arenas_, pool_};
};

TEST_F(PlacementTest, ASmallHostTensorInANamespaceGoesToAnArenaAndWaitsForOneBeingMade) {
  Tensor first = Make("ns", 4096);
  Placement::Choice choice = Choose(first);
  ASSERT_EQ(choice.kind, Placement::Kind::kNewArena);
  EXPECT_EQ(choice.bytes, kFirstArenaBytes);
  arenas_.StartMaking(session_.id, "ns");
  Tensor second = Make("ns", 4096);
  EXPECT_EQ(Choose(second).kind, Placement::Kind::kAwaitArena);
  arenas_.FinishMaking(session_.id, "ns");
  arenas_.AddArena(registry_, session_, "ns", choice.bytes, std::make_unique<SizedBuffer>(choice.bytes));
  EXPECT_EQ(Choose(second).kind, Placement::Kind::kArenaSlot);
  EXPECT_NE(second.buffer_id, 0u);  // placed: its slot is set
}

TEST_F(PlacementTest, WhatIsNotArenaSizedOrHostOrNamedOrAskedIsolatedGetsItsOwnBuffer) {
  Tensor unnamed = Make("", 4096);
  Tensor large = Make("ns", kArenaMaxTensor + 4096);
  Tensor device = Make("ns", 4096, &kGpu);
  Tensor isolated = Make("ns", 4096);
  for (Tensor* tensor : {&unnamed, &large, &device}) {
    Placement::Choice choice = Choose(*tensor);
    EXPECT_EQ(choice.kind, Placement::Kind::kDedicated);
    EXPECT_EQ(choice.bytes, tensor->layout.extent);
  }
  EXPECT_EQ(Choose(isolated, Wants(true, false)).kind, Placement::Kind::kDedicated);
  EXPECT_FALSE(placement_.InArena(isolated, Wants(true, false)));
  EXPECT_TRUE(placement_.InArena(isolated, Wants(false, false)));
}

TEST_F(PlacementTest, NoBytesNeedNoMemory) {
  Tensor empty = Make("ns", 0);
  EXPECT_EQ(Choose(empty).kind, Placement::Kind::kNoMemory);
}

TEST_F(PlacementTest, ARecyclableAllocationTakesAPooledBufferItStillMaps) {
  const uint64_t size = kArenaMaxTensor * 4;
  pool_.Put(BufferPool::Entry{42, session_.id, "ns", &kHost, size, true, {}, std::make_unique<SizedBuffer>(size)});
  Tensor tensor = Make("ns", size);
  const std::vector<uint64_t> maps{42};
  EXPECT_EQ(Choose(tensor, Wants(false, false, maps)).kind, Placement::Kind::kDedicated);
  EXPECT_EQ(Choose(tensor, Wants(false, true)).kind, Placement::Kind::kDedicated);  // names none it maps
  Placement::Choice choice = Choose(tensor, Wants(false, true, maps));
  ASSERT_EQ(choice.kind, Placement::Kind::kRecycled);
  ASSERT_TRUE(choice.recycled.has_value());
  EXPECT_EQ(choice.recycled->buffer_id, 42u);
  EXPECT_EQ(pool_.size(), 0u);  // taken
}

TEST_F(PlacementTest, ABatchFillsTheNewArenaInOrderAndTheFirstThatDoesNotFitMakesTheNextArena) {
  constexpr uint64_t kQuarter = kFirstArenaBytes / 4;  // whole pages wherever pages are up to 64 KiB
  AddArena("ns", kFirstArenaBytes);
  std::vector<uint64_t> placed;
  Placement::Overflow overflow = placement_.PlaceBatch(
      registry_, session_, Waiting("ns", {2 * kQuarter, 3 * kQuarter, kQuarter, 2 * kQuarter}),
      [](QueuedAllocate&) { return true; },
      [&](QueuedAllocate& allocation) {
        EXPECT_NE(allocation.tensor.buffer_id, 0u);  // its slot is set
        placed.push_back(allocation.tensor.layout.extent);
      });
  // A later, smaller one still takes the room an earlier, larger one could not.
  EXPECT_THAT(placed, ElementsAre(2 * kQuarter, kQuarter));
  ASSERT_EQ(overflow.allocations.size(), 2u);
  EXPECT_EQ(overflow.allocations[0].tensor.layout.extent, 3 * kQuarter);
  EXPECT_EQ(overflow.allocations[1].tensor.layout.extent, 2 * kQuarter);
  EXPECT_EQ(overflow.next_arena_bytes, 2 * kFirstArenaBytes);  // twice the largest the session has there
}

TEST_F(PlacementTest, AnAllocationTheBrokerRefusesTakesNoSlotOfTheBatch) {
  AddArena("ns", kFirstArenaBytes);
  int offered = 0;
  std::vector<uint64_t> placed_ids;
  Placement::Overflow overflow = placement_.PlaceBatch(
      registry_, session_, Waiting("ns", {kFirstArenaBytes, kFirstArenaBytes}),
      [&](QueuedAllocate&) { return ++offered > 1; },
      [&](QueuedAllocate& allocation) { placed_ids.push_back(allocation.tensor.buffer_id); });
  EXPECT_EQ(offered, 2);
  EXPECT_EQ(placed_ids.size(), 1u);  // the second one, in the whole arena the first left
  EXPECT_THAT(overflow.allocations, IsEmpty());
  EXPECT_EQ(overflow.next_arena_bytes, 0u);
}

}  // namespace
}  // namespace tensord::server
