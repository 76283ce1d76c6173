#include "client/lease_table.h"

#include <chrono>

#include "gtest/gtest.h"
#include "tests/unit/client/test_views.h"

namespace tensord::internal {
namespace {

using std::chrono::milliseconds;
using testing::NewQueue;
using Clock = LeaseTable::Clock;
using Disposition = LeaseTable::Disposition;

LeaseView* NamedView(const std::shared_ptr<ReleaseQueue>& queue, uint64_t id, std::string name,
                     uint64_t generation = 1) {
  LeaseView::Params p;
  p.info.tensor_id = id;
  p.info.name = name;
  p.info.generation = generation;
  p.info.shape = {0};
  p.info.strides = {1};
  p.lease_id = 100 + id;
  p.cache_name = std::move(name);
  return new LeaseView(std::move(p), queue);
}

// Drops the caller's reference and returns the view the queue now holds (refcount 0).
LeaseView* DropToZero(const std::shared_ptr<ReleaseQueue>& queue, LeaseView* view) {
  view->Unref();
  std::vector<LeaseView*> queued = queue->PopAll();
  EXPECT_EQ(queued.size(), 1u);
  return queued.empty() ? nullptr : queued[0];
}

void Destroy(std::vector<LeaseView*> views) {
  for (LeaseView* v : views) delete v;
}

class LeaseTableTest : public ::testing::Test {
 protected:
  std::shared_ptr<ReleaseQueue> queue_ = NewQueue();
  LeaseTable table_{true, milliseconds(2000)};
};

TEST_F(LeaseTableTest, ALastReferenceByNameIsCachedAndHitWithoutTheBroker) {
  LeaseView* view = NamedView(queue_, 1, "ns/a", 3);
  ASSERT_TRUE(table_.Insert(view).inserted);
  EXPECT_EQ(table_.FindByName("ns/a", ViewKind::kPrivate, 0), view);  // live hit
  view->Unref();
  ASSERT_EQ(DropToZero(queue_, view), view);
  const auto now = Clock::now();
  EXPECT_EQ(table_.Dispose(view, now, false), Disposition::kCached);
  EXPECT_EQ(table_.idle_count(), 1u);
  // A hit revives it at refcount 1; generation requirements are honoured.
  EXPECT_EQ(table_.FindByName("ns/a", ViewKind::kPrivate, 4), nullptr);
  EXPECT_EQ(table_.FindByName("ns/a", ViewKind::kReadOnly, 0), nullptr);
  EXPECT_EQ(table_.FindByName("ns/a", ViewKind::kPrivate, 3), view);
  EXPECT_EQ(view->refs(), 1u);
  EXPECT_EQ(table_.idle_count(), 0u);
  ASSERT_EQ(DropToZero(queue_, view), view);
  EXPECT_EQ(table_.Dispose(view, now, false), Disposition::kCached);
  Destroy(table_.TakeAllIdle());
}

TEST_F(LeaseTableTest, ADroppedViewIsRevivedBeforeTheSenderDecides) {
  LeaseView* view = NamedView(queue_, 1, "ns/a");
  ASSERT_TRUE(table_.Insert(view).inserted);
  view->Unref();  // the last reference: on the release queue now
  // A repeated get finds it before the sender ran: no round trip.
  EXPECT_EQ(table_.FindByName("ns/a", ViewKind::kPrivate, 0), view);
  EXPECT_EQ(view->refs(), 1u);
  view->Unref();  // zero again while still on the queue: not queued a second time
  std::vector<LeaseView*> queued = queue_->PopAll();
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0], view);
  EXPECT_EQ(table_.FindByName("ns/a", ViewKind::kPrivate, 0), view);
  const auto now = Clock::now();
  EXPECT_EQ(table_.Dispose(view, now, false), Disposition::kRevived);  // left alone
  EXPECT_EQ(view->refs(), 1u);
  EXPECT_EQ(table_.idle_count(), 0u);
  ASSERT_EQ(DropToZero(queue_, view), view);  // queued anew by its next last Unref
  EXPECT_EQ(table_.Dispose(view, now, false), Disposition::kCached);
  Destroy(table_.TakeAllIdle());
}

TEST_F(LeaseTableTest, LingerExpiryReleasesTheCachedLease) {
  LeaseView* view = NamedView(queue_, 1, "ns/a");
  table_.Insert(view);
  DropToZero(queue_, view);
  const auto now = Clock::now();
  ASSERT_EQ(table_.Dispose(view, now, false), Disposition::kCached);
  Clock::time_point next;
  EXPECT_TRUE(table_.TakeExpired(now + milliseconds(1999), &next).empty());
  EXPECT_EQ(next, now + milliseconds(2000));
  std::vector<LeaseView*> expired = table_.TakeExpired(now + milliseconds(2000), &next);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0], view);
  EXPECT_EQ(next, Clock::time_point::max());
  EXPECT_EQ(table_.FindByName("ns/a", ViewKind::kPrivate, 0), nullptr);
  EXPECT_EQ(table_.held_count(), 0u);
  Destroy(expired);
}

TEST_F(LeaseTableTest, ARetiredPushDropsTheCachedLeaseAndKeepsLiveOnesFromCaching) {
  LeaseView* idle = NamedView(queue_, 1, "ns/a");
  LeaseView* live = NamedView(queue_, 2, "ns/b");
  table_.Insert(idle);
  table_.Insert(live);
  DropToZero(queue_, idle);
  ASSERT_EQ(table_.Dispose(idle, Clock::now(), false), Disposition::kCached);
  std::vector<LeaseView*> dropped = table_.OnRetired(1);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0], idle);
  EXPECT_TRUE(table_.OnRetired(2).empty());
  EXPECT_TRUE(live->retired());
  EXPECT_EQ(table_.FindByName("ns/b", ViewKind::kPrivate, 0), nullptr);
  DropToZero(queue_, live);
  EXPECT_EQ(table_.Dispose(live, Clock::now(), false), Disposition::kRelease);  // released, not cached
  Destroy(dropped);
  delete live;
}

TEST_F(LeaseTableTest, CacheResetAndDeleteByThisClientDropCachedLeases) {
  LeaseView* a = NamedView(queue_, 1, "ns/a");
  LeaseView* b = NamedView(queue_, 2, "ns/b");
  table_.Insert(a);
  table_.Insert(b);
  DropToZero(queue_, a);
  DropToZero(queue_, b);
  ASSERT_EQ(table_.Dispose(a, Clock::now(), false), Disposition::kCached);
  ASSERT_EQ(table_.Dispose(b, Clock::now(), false), Disposition::kCached);
  std::vector<LeaseView*> by_name = table_.DropName("ns/a");
  ASSERT_EQ(by_name.size(), 1u);
  EXPECT_EQ(by_name[0], a);
  std::vector<LeaseView*> reset = table_.DropAllCached();
  ASSERT_EQ(reset.size(), 1u);
  EXPECT_EQ(reset[0], b);
  EXPECT_EQ(table_.idle_count(), 0u);
  Destroy(by_name);
  Destroy(reset);
}

TEST_F(LeaseTableTest, ASecondLeaseOnAHeldTensorReusesTheView) {
  LeaseView* first = NamedView(queue_, 1, "");
  ASSERT_TRUE(table_.Insert(first).inserted);
  // The acquire path looks the tensor up before mapping anything.
  EXPECT_EQ(table_.FindByTensor(1, ViewKind::kPrivate, "ns/a"), first);
  EXPECT_EQ(first->refs(), 2u);
  // Acquired by name now, so it serves that name.
  EXPECT_EQ(table_.FindByName("ns/a", ViewKind::kPrivate, 0), first);
  first->Unref();  // that hit's reference
  // A racing insert of another view for the same tensor gets the existing one back.
  LeaseView* racer = NamedView(queue_, 1, "ns/a");
  LeaseTable::InsertResult r = table_.Insert(racer);
  EXPECT_FALSE(r.inserted);
  EXPECT_EQ(r.view, first);
  EXPECT_EQ(first->refs(), 3u);
  delete racer;
  first->Unref();
  first->Unref();
  DropToZero(queue_, first);
  EXPECT_EQ(table_.Dispose(first, Clock::now(), false), Disposition::kCached);
  Destroy(table_.TakeAllIdle());
}

TEST_F(LeaseTableTest, AViewOnItsWayOutIsRevivedByAnInsertOfItsTensor) {
  LeaseView* old = NamedView(queue_, 1, "ns/a");
  table_.Insert(old);
  old->Unref();  // refcount 0, queued, not yet seen by the sender
  // Another acquire of the tensor raced the drop: the old view comes back and the new
  // one (and its second remote lease) is the caller's to give back.
  LeaseView* fresh = NamedView(queue_, 1, "ns/a");
  LeaseTable::InsertResult r = table_.Insert(fresh);
  EXPECT_FALSE(r.inserted);
  EXPECT_EQ(r.view, old);
  EXPECT_EQ(old->refs(), 1u);
  delete fresh;
  ASSERT_EQ(queue_->PopAll().size(), 1u);
  EXPECT_EQ(table_.Dispose(old, Clock::now(), false), Disposition::kRevived);
  ASSERT_EQ(DropToZero(queue_, old), old);
  EXPECT_EQ(table_.Dispose(old, Clock::now(), /*closing=*/true), Disposition::kRelease);
  EXPECT_EQ(table_.held_count(), 0u);
  delete old;
}

TEST_F(LeaseTableTest, ANewBindingOfANameDisplacesTheCachedOldOne) {
  LeaseView* old = NamedView(queue_, 1, "ns/a", 1);
  table_.Insert(old);
  DropToZero(queue_, old);
  ASSERT_EQ(table_.Dispose(old, Clock::now(), false), Disposition::kCached);
  LeaseView* fresh = NamedView(queue_, 2, "ns/a", 2);
  LeaseTable::InsertResult r = table_.Insert(fresh);
  EXPECT_TRUE(r.inserted);
  ASSERT_EQ(r.to_release.size(), 1u);
  EXPECT_EQ(r.to_release[0], old);
  EXPECT_EQ(table_.FindByName("ns/a", ViewKind::kPrivate, 2), fresh);
  delete old;
  fresh->Unref();
  fresh->Unref();
  for (LeaseView* v : queue_->PopAll()) {
    EXPECT_EQ(table_.Dispose(v, Clock::now(), /*closing=*/true), Disposition::kRelease);
    delete v;
  }
}

TEST(LeaseTableNoCacheTest, WithTheCacheOffNothingIsKept) {
  auto queue = NewQueue();
  LeaseTable table(false, milliseconds(2000));
  LeaseView* view = NamedView(queue, 1, "ns/a");
  table.Insert(view);
  EXPECT_EQ(table.FindByName("ns/a", ViewKind::kPrivate, 0), nullptr);
  DropToZero(queue, view);
  EXPECT_EQ(table.Dispose(view, Clock::now(), false), Disposition::kRelease);
  EXPECT_EQ(table.held_count(), 0u);
  delete view;
}

}  // namespace
}  // namespace tensord::internal
