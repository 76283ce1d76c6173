#include "server/memory/arena.h"

#include <random>
#include <set>

#include "gtest/gtest.h"
#include "tests/unit/server/broker_fixture.h"

namespace tensord::server {
namespace {

const uint64_t kArenaAlignment = ArenaAlignment();

TEST(ArenaSlotsTest, SlotsAreWholePagesAndFirstFit) {
  ArenaSlots slots(8 * kArenaAlignment);
  EXPECT_EQ(ArenaSlots::SlotBytes(0), kArenaAlignment);
  EXPECT_EQ(ArenaSlots::SlotBytes(1), kArenaAlignment);
  EXPECT_EQ(ArenaSlots::SlotBytes(kArenaAlignment + 1), 2 * kArenaAlignment);
  EXPECT_EQ(slots.Allocate(kArenaAlignment), 0u);
  EXPECT_EQ(slots.Allocate(2 * kArenaAlignment), kArenaAlignment);
  EXPECT_EQ(slots.Allocate(kArenaAlignment), 3 * kArenaAlignment);
  EXPECT_EQ(slots.free_bytes(), 4 * kArenaAlignment);
  EXPECT_FALSE(slots.Allocate(5 * kArenaAlignment).has_value());
  // The freed hole is reused first; the rest comes from the tail.
  slots.Free(kArenaAlignment, 2 * kArenaAlignment);
  EXPECT_EQ(slots.Allocate(kArenaAlignment), kArenaAlignment);
  EXPECT_EQ(slots.Allocate(2 * kArenaAlignment), 4 * kArenaAlignment);
}

TEST(ArenaSlotsTest, FreedNeighboursCoalesceBackToOneRange) {
  ArenaSlots slots(4 * kArenaAlignment);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(slots.Allocate(kArenaAlignment), i * kArenaAlignment);
  EXPECT_FALSE(slots.Allocate(kArenaAlignment).has_value());
  slots.Free(0, kArenaAlignment);
  slots.Free(2 * kArenaAlignment, kArenaAlignment);
  // Two single holes: a two-unit slot does not fit until the middle one goes too.
  EXPECT_FALSE(slots.Allocate(2 * kArenaAlignment).has_value());
  slots.Free(kArenaAlignment, kArenaAlignment);
  EXPECT_EQ(slots.Allocate(3 * kArenaAlignment), 0u);
  slots.Free(0, 3 * kArenaAlignment);
  slots.Free(3 * kArenaAlignment, kArenaAlignment);
  EXPECT_TRUE(slots.unused());
  EXPECT_EQ(slots.Allocate(4 * kArenaAlignment), 0u);
}

TEST(ArenaSlotsTest, RandomUseNeverHandsOutOverlappingSlots) {
  constexpr uint64_t kUnits = 64;
  ArenaSlots slots(kUnits * kArenaAlignment);
  std::mt19937 random(7);
  std::map<uint64_t, uint64_t> live;  // offset -> bytes
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || random() % 2 == 0) {
      uint64_t bytes = (1 + random() % 4) * kArenaAlignment;
      std::optional<uint64_t> offset = slots.Allocate(bytes);
      if (!offset) continue;
      ASSERT_LE(*offset + bytes, slots.size());
      auto next = live.lower_bound(*offset);
      if (next != live.end()) {
        ASSERT_GE(next->first, *offset + bytes);
      }
      if (next != live.begin()) {
        ASSERT_LE(std::prev(next)->first + std::prev(next)->second, *offset);
      }
      live.emplace(*offset, bytes);
    } else {
      auto it = std::next(live.begin(), static_cast<long>(random() % live.size()));
      slots.Free(it->first, it->second);
      live.erase(it);
    }
    uint64_t used = 0;
    for (const auto& [offset, bytes] : live) used += bytes;
    ASSERT_EQ(slots.free_bytes(), slots.size() - used);
  }
}

}  // namespace

namespace testing {
namespace {

class BrokerArenaTest : public BrokerTest {
 protected:
  static constexpr uint64_t kArenaBytes = 1 << 20;
  BrokerArenaTest() {
    Start([](BrokerOptions& options) {
      options.arena_bytes = kArenaBytes;
      options.arena_max_tensor_bytes = 256 << 10;
    });
  }
  uint64_t HostBytesInUse() { return broker_->GetStatus().host_bytes_in_use(); }
  void Release(uint64_t session, uint64_t lease) {
    v1::ReleaseRequest release;
    release.add_lease_ids(lease);
    ASSERT_TRUE(broker_->Release(session, release).ok());
  }
};

TEST_F(BrokerArenaTest, SmallTensorsInANamespaceShareOneArenaInWholePages) {
  uint64_t session = Open();
  auto a = Allocate(session, "ns", 16);    // 64 bytes
  auto b = Allocate(session, "ns", 2000);  // 8000 bytes: two pages
  auto c = Allocate(session, "ns", 16);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const v1::BufferRef& ra = a->tensor().buffer();
  const v1::BufferRef& rb = b->tensor().buffer();
  const v1::BufferRef& rc = c->tensor().buffer();
  EXPECT_TRUE(ra.arena());
  EXPECT_EQ(ra.buffer_id(), rb.buffer_id());
  EXPECT_EQ(ra.buffer_id(), rc.buffer_id());
  EXPECT_EQ(ra.size(), kFirstArenaBytes);
  EXPECT_EQ(ra.extent(), 64u);
  EXPECT_EQ(rb.extent(), 8000u);
  std::set<uint64_t> offsets{ra.offset(), rb.offset(), rc.offset()};
  const uint64_t page = ArenaAlignment();
  EXPECT_EQ(offsets, (std::set<uint64_t>{0, page, (page == 4096 ? 3 : 2) * page}));
  // The quota counts the arena once.
  EXPECT_EQ(HostBytesInUse(), kFirstArenaBytes);
  EXPECT_EQ(broker_->GetStatus().buffers(), 1u);
}

TEST_F(BrokerArenaTest, IsolatedLargeAndUnnamespacedTensorsGetTheirOwnBuffers) {
  uint64_t session = Open();
  auto small = Allocate(session, "ns", 16);
  auto no_ns = Allocate(session, "", 16);
  auto large = Allocate(session, "ns", (256 << 10) / 4 + 1);
  v1::AllocateRequest request;
  request.set_ns("ns");
  request.set_isolated(true);
  v1::TensorDesc* desc = request.mutable_desc();
  desc->mutable_dtype()->set_code(v1::DTYPE_CODE_UINT);
  desc->mutable_dtype()->set_bits(8);
  desc->mutable_dtype()->set_lanes(1);
  desc->add_shape(10);
  desc->mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
  std::promise<absl::StatusOr<v1::AllocateResponse>> promise;
  broker_->Allocate(session, request, [&](absl::StatusOr<v1::AllocateResponse> r) { promise.set_value(std::move(r)); });
  auto isolated = promise.get_future().get();
  ASSERT_TRUE(small.ok() && no_ns.ok() && large.ok() && isolated.ok());
  EXPECT_TRUE(small->tensor().buffer().arena());
  for (const auto* own : {&*no_ns, &*large, &*isolated}) {
    EXPECT_FALSE(own->tensor().buffer().arena());
    EXPECT_NE(own->tensor().buffer().buffer_id(), small->tensor().buffer().buffer_id());
    EXPECT_EQ(own->tensor().buffer().offset(), 0u);
  }
}

TEST_F(BrokerArenaTest, ArenasArePerSessionAndNamespace) {
  uint64_t first = Open();
  uint64_t second = Open();
  auto a = Allocate(first, "ns", 16);
  auto b = Allocate(first, "other", 16);
  auto c = Allocate(second, "ns", 16);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NE(a->tensor().buffer().buffer_id(), b->tensor().buffer().buffer_id());
  EXPECT_NE(a->tensor().buffer().buffer_id(), c->tensor().buffer().buffer_id());
  // A tensor carved from the "ns" arena cannot be published into another namespace.
  Seal(first, *a);
  absl::StatusOr<v1::PublishResponse> moved = Publish(first, a->tensor().tensor_id(), "other/x");
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kFailedPrecondition) << moved.status();
}

TEST_F(BrokerArenaTest, ASlotIsReusedOnlyAfterItsTensorHasNoBindingAndNoLease) {
  uint64_t producer = Open();
  uint64_t reader = Open();
  auto a = Allocate(producer, "ns", 16);
  ASSERT_TRUE(a.ok());
  Seal(producer, *a);
  ASSERT_TRUE(Publish(producer, a->tensor().tensor_id(), "ns/a").ok());
  Release(producer, a->lease_id());
  auto held = Acquire(reader, "ns/a");
  ASSERT_TRUE(held.ok());
  // Unbound but still leased by the reader: its slot stays taken.
  v1::DeleteRequest del;
  del.set_name("ns/a");
  ASSERT_TRUE(broker_->Delete(producer, del).ok());
  auto b = Allocate(producer, "ns", 16);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->tensor().buffer().offset(), a->tensor().buffer().offset());
  Release(reader, held->lease_id());
  auto c = Allocate(producer, "ns", 16);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->tensor().buffer().offset(), a->tensor().buffer().offset());
}

TEST_F(BrokerArenaTest, AFullArenaMakesAnotherTwiceAsLargeUpToTheLimitAndAllCountInTheQuota) {
  uint64_t session = Open();
  std::vector<uint64_t> sizes;  // of each new arena, in order
  std::set<uint64_t> buffers;
  for (int i = 0; i < 9; ++i) {  // 9 x 256 KiB: arenas of 256 KiB, 512 KiB, 1 MiB, 1 MiB
    auto t = Allocate(session, "ns", (256 << 10) / 4);
    ASSERT_TRUE(t.ok()) << t.status();
    if (buffers.insert(t->tensor().buffer().buffer_id()).second) sizes.push_back(t->tensor().buffer().size());
  }
  EXPECT_EQ(sizes, (std::vector<uint64_t>{kFirstArenaBytes, 2 * kFirstArenaBytes, kArenaBytes, kArenaBytes}));
  EXPECT_EQ(HostBytesInUse(), kFirstArenaBytes * 3 + 2 * kArenaBytes);
}

// Allocations sent back to back (put_many) before the first arena exists wait for it.
TEST_F(BrokerArenaTest, PipelinedAllocationsShareTheArenaBeingMadeAndOverflowIntoOneMore) {
  uint64_t session = Open();
  std::vector<std::promise<absl::StatusOr<v1::AllocateResponse>>> promises(9);
  for (size_t i = 0; i < promises.size(); ++i) {
    v1::AllocateRequest request;
    request.set_ns("ns");
    v1::TensorDesc* desc = request.mutable_desc();
    desc->mutable_dtype()->set_code(v1::DTYPE_CODE_UINT);
    desc->mutable_dtype()->set_bits(8);
    desc->mutable_dtype()->set_lanes(1);
    desc->add_shape(i < 5 ? 256 << 10 : 4096);  // arenas of 256 KiB, 512 KiB, then 1 MiB
    desc->mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
    broker_->Allocate(session, request, [&promises, i](absl::StatusOr<v1::AllocateResponse> r) {
      promises[i].set_value(std::move(r));
    });
  }
  std::set<uint64_t> arenas;
  std::set<std::pair<uint64_t, uint64_t>> slots;
  for (auto& promise : promises) {
    absl::StatusOr<v1::AllocateResponse> r = promise.get_future().get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->tensor().buffer().arena());
    arenas.insert(r->tensor().buffer().buffer_id());
    EXPECT_TRUE(slots.emplace(r->tensor().buffer().buffer_id(), r->tensor().buffer().offset()).second);
  }
  EXPECT_EQ(arenas.size(), 3u);
  EXPECT_EQ(HostBytesInUse(), kFirstArenaBytes * 3 + kArenaBytes);
}

TEST_F(BrokerArenaTest, AnArenaNeedsQuotaForItsWholeSize) {
  Start([](BrokerOptions& options) {
    options.arena_bytes = 1 << 20;
    options.arena_max_tensor_bytes = 64 << 10;
    options.max_host_bytes = kFirstArenaBytes / 2;
  });
  uint64_t session = Open();
  auto t = Allocate(session, "ns", 16);
  ASSERT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
  EXPECT_NE(t.status().message().find("arena"), std::string::npos) << t.status();
  EXPECT_EQ(HostBytesInUse(), 0u);
}

TEST_F(BrokerArenaTest, AnArenaOutlivesItsProducerWhileATensorInItLives) {
  uint64_t producer = Open();
  uint64_t reader = Open();
  auto kept = Allocate(producer, "ns", 16);
  auto dropped = Allocate(producer, "ns", 16);
  ASSERT_TRUE(kept.ok() && dropped.ok());
  Seal(producer, *kept);
  ASSERT_TRUE(Publish(producer, kept->tensor().tensor_id(), "ns/kept").ok());
  auto lease = Acquire(reader, "ns/kept");
  ASSERT_TRUE(lease.ok());
  broker_->CloseSession(producer);
  // The binding and the reader's lease keep the arena; the unpublished tensor is gone.
  EXPECT_EQ(HostBytesInUse(), kFirstArenaBytes);
  EXPECT_EQ(broker_->GetStatus().tensors(), 1u);
  v1::FetchFd fetch;
  fetch.add_buffer_ids(kept->tensor().buffer().buffer_id());
  ASSERT_TRUE(broker_->FetchHandles(reader, fetch).ok());
  v1::DeleteRequest del;
  del.set_name("ns/kept");
  ASSERT_TRUE(broker_->Delete(reader, del).ok());
  EXPECT_EQ(HostBytesInUse(), kFirstArenaBytes);
  Release(reader, lease->lease_id());
  EXPECT_EQ(HostBytesInUse(), 0u);
  EXPECT_EQ(broker_->GetStatus().buffers(), 0u);
}

TEST_F(BrokerArenaTest, AnEmptyArenaStaysWithItsSessionAndGoesWhenItCloses) {
  uint64_t session = Open();
  auto t = Allocate(session, "ns", 16);
  ASSERT_TRUE(t.ok());
  Release(session, t->lease_id());
  EXPECT_EQ(broker_->GetStatus().tensors(), 0u);
  EXPECT_EQ(broker_->GetStatus().buffers(), 1u);  // the session's pool
  auto again = Allocate(session, "ns", 16);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tensor().buffer().buffer_id(), t->tensor().buffer().buffer_id());
  broker_->CloseSession(session);
  EXPECT_EQ(broker_->GetStatus().buffers(), 0u);
  EXPECT_EQ(HostBytesInUse(), 0u);
}

TEST_F(BrokerArenaTest, ArenasOffGivesEveryTensorItsOwnBuffer) {
  Start([](BrokerOptions& options) { options.arena_bytes = 0; });
  uint64_t session = Open();
  auto a = Allocate(session, "ns", 16);
  auto b = Allocate(session, "ns", 16);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(a->tensor().buffer().arena());
  EXPECT_NE(a->tensor().buffer().buffer_id(), b->tensor().buffer().buffer_id());
}

}  // namespace
}  // namespace testing
}  // namespace tensord::server
