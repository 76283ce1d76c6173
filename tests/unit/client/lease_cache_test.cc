#include "client/lease_cache.h"

#include <chrono>

#include "gtest/gtest.h"
#include "tests/unit/client/test_views.h"

namespace tensord::internal {
namespace {

using std::chrono::milliseconds;
using testing::NewQueue;
using Clock = LeaseCache::Clock;
using Disposition = LeaseCache::Disposition;

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

class LeaseCacheTest : public ::testing::Test {
 protected:
  std::shared_ptr<ReleaseQueue> queue_ = NewQueue();
  LeaseCache cache_{true, milliseconds(2000)};
};

TEST_F(LeaseCacheTest, ALastReferenceByNameIsCachedAndHitWithoutTheBroker) {
  LeaseView* view = NamedView(queue_, 1, "ns/a", 3);
  ASSERT_TRUE(cache_.Insert(view).inserted);
  EXPECT_EQ(cache_.FindByName("ns/a", ViewKind::kPrivate, 0), view);  // live hit
  view->Unref();
  ASSERT_EQ(DropToZero(queue_, view), view);
  const auto now = Clock::now();
  EXPECT_EQ(cache_.Dispose(view, now, false), Disposition::kCached);
  EXPECT_EQ(cache_.idle_count(), 1u);
  // A hit revives it at refcount 1; generation requirements are honoured.
  EXPECT_EQ(cache_.FindByName("ns/a", ViewKind::kPrivate, 4), nullptr);
  EXPECT_EQ(cache_.FindByName("ns/a", ViewKind::kReadOnly, 0), nullptr);
  EXPECT_EQ(cache_.FindByName("ns/a", ViewKind::kPrivate, 3), view);
  EXPECT_EQ(view->refs(), 1u);
  EXPECT_EQ(cache_.idle_count(), 0u);
  ASSERT_EQ(DropToZero(queue_, view), view);
  EXPECT_EQ(cache_.Dispose(view, now, false), Disposition::kCached);
  Destroy(cache_.TakeAllIdle());
}

TEST_F(LeaseCacheTest, ADroppedViewIsRevivedBeforeTheSenderDecides) {
  LeaseView* view = NamedView(queue_, 1, "ns/a");
  ASSERT_TRUE(cache_.Insert(view).inserted);
  view->Unref();  // the last reference: on the release queue now
  // A repeated get finds it before the sender ran: no round trip.
  EXPECT_EQ(cache_.FindByName("ns/a", ViewKind::kPrivate, 0), view);
  EXPECT_EQ(view->refs(), 1u);
  view->Unref();  // zero again while still on the queue: not queued a second time
  std::vector<LeaseView*> queued = queue_->PopAll();
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0], view);
  EXPECT_EQ(cache_.FindByName("ns/a", ViewKind::kPrivate, 0), view);
  const auto now = Clock::now();
  EXPECT_EQ(cache_.Dispose(view, now, false), Disposition::kRevived);  // left alone
  EXPECT_EQ(view->refs(), 1u);
  EXPECT_EQ(cache_.idle_count(), 0u);
  ASSERT_EQ(DropToZero(queue_, view), view);  // queued anew by its next last Unref
  EXPECT_EQ(cache_.Dispose(view, now, false), Disposition::kCached);
  Destroy(cache_.TakeAllIdle());
}

TEST_F(LeaseCacheTest, LingerExpiryReleasesTheCachedLease) {
  LeaseView* view = NamedView(queue_, 1, "ns/a");
  cache_.Insert(view);
  DropToZero(queue_, view);
  const auto now = Clock::now();
  ASSERT_EQ(cache_.Dispose(view, now, false), Disposition::kCached);
  Clock::time_point next;
  EXPECT_TRUE(cache_.TakeExpired(now + milliseconds(1999), &next).empty());
  EXPECT_EQ(next, now + milliseconds(2000));
  std::vector<LeaseView*> expired = cache_.TakeExpired(now + milliseconds(2000), &next);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0], view);
  EXPECT_EQ(next, Clock::time_point::max());
  EXPECT_EQ(cache_.FindByName("ns/a", ViewKind::kPrivate, 0), nullptr);
  EXPECT_EQ(cache_.held_count(), 0u);
  Destroy(expired);
}

TEST_F(LeaseCacheTest, ARetiredPushDropsTheCachedLeaseAndKeepsLiveOnesFromCaching) {
  LeaseView* idle = NamedView(queue_, 1, "ns/a");
  LeaseView* live = NamedView(queue_, 2, "ns/b");
  cache_.Insert(idle);
  cache_.Insert(live);
  DropToZero(queue_, idle);
  ASSERT_EQ(cache_.Dispose(idle, Clock::now(), false), Disposition::kCached);
  std::vector<LeaseView*> dropped = cache_.OnRetired(1);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0], idle);
  EXPECT_TRUE(cache_.OnRetired(2).empty());
  EXPECT_TRUE(live->retired());
  EXPECT_EQ(cache_.FindByName("ns/b", ViewKind::kPrivate, 0), nullptr);
  DropToZero(queue_, live);
  EXPECT_EQ(cache_.Dispose(live, Clock::now(), false), Disposition::kRelease);  // released, not cached
  Destroy(dropped);
  delete live;
}

TEST_F(LeaseCacheTest, CacheResetAndDeleteByThisClientDropCachedLeases) {
  LeaseView* a = NamedView(queue_, 1, "ns/a");
  LeaseView* b = NamedView(queue_, 2, "ns/b");
  cache_.Insert(a);
  cache_.Insert(b);
  DropToZero(queue_, a);
  DropToZero(queue_, b);
  ASSERT_EQ(cache_.Dispose(a, Clock::now(), false), Disposition::kCached);
  ASSERT_EQ(cache_.Dispose(b, Clock::now(), false), Disposition::kCached);
  std::vector<LeaseView*> by_name = cache_.DropName("ns/a");
  ASSERT_EQ(by_name.size(), 1u);
  EXPECT_EQ(by_name[0], a);
  std::vector<LeaseView*> reset = cache_.DropAllCached();
  ASSERT_EQ(reset.size(), 1u);
  EXPECT_EQ(reset[0], b);
  EXPECT_EQ(cache_.idle_count(), 0u);
  Destroy(by_name);
  Destroy(reset);
}

TEST_F(LeaseCacheTest, ASecondLeaseOnAHeldTensorReusesTheView) {
  LeaseView* first = NamedView(queue_, 1, "");
  ASSERT_TRUE(cache_.Insert(first).inserted);
  // The acquire path looks the tensor up before mapping anything.
  EXPECT_EQ(cache_.FindByTensor(1, ViewKind::kPrivate, "ns/a"), first);
  EXPECT_EQ(first->refs(), 2u);
  // Acquired by name now, so it serves that name.
  EXPECT_EQ(cache_.FindByName("ns/a", ViewKind::kPrivate, 0), first);
  first->Unref();  // that hit's reference
  // A racing insert of another view for the same tensor gets the existing one back.
  LeaseView* racer = NamedView(queue_, 1, "ns/a");
  LeaseCache::InsertResult r = cache_.Insert(racer);
  EXPECT_FALSE(r.inserted);
  EXPECT_EQ(r.view, first);
  EXPECT_EQ(first->refs(), 3u);
  delete racer;
  first->Unref();
  first->Unref();
  DropToZero(queue_, first);
  EXPECT_EQ(cache_.Dispose(first, Clock::now(), false), Disposition::kCached);
  Destroy(cache_.TakeAllIdle());
}

TEST_F(LeaseCacheTest, AViewOnItsWayOutIsRevivedByAnInsertOfItsTensor) {
  LeaseView* old = NamedView(queue_, 1, "ns/a");
  cache_.Insert(old);
  old->Unref();  // refcount 0, queued, not yet seen by the sender
  // Another acquire of the tensor raced the drop: the old view comes back and the new
  // one (and its second remote lease) is the caller's to give back.
  LeaseView* fresh = NamedView(queue_, 1, "ns/a");
  LeaseCache::InsertResult r = cache_.Insert(fresh);
  EXPECT_FALSE(r.inserted);
  EXPECT_EQ(r.view, old);
  EXPECT_EQ(old->refs(), 1u);
  delete fresh;
  ASSERT_EQ(queue_->PopAll().size(), 1u);
  EXPECT_EQ(cache_.Dispose(old, Clock::now(), false), Disposition::kRevived);
  ASSERT_EQ(DropToZero(queue_, old), old);
  EXPECT_EQ(cache_.Dispose(old, Clock::now(), /*closing=*/true), Disposition::kRelease);
  EXPECT_EQ(cache_.held_count(), 0u);
  delete old;
}

TEST_F(LeaseCacheTest, ANewBindingOfANameDisplacesTheCachedOldOne) {
  LeaseView* old = NamedView(queue_, 1, "ns/a", 1);
  cache_.Insert(old);
  DropToZero(queue_, old);
  ASSERT_EQ(cache_.Dispose(old, Clock::now(), false), Disposition::kCached);
  LeaseView* fresh = NamedView(queue_, 2, "ns/a", 2);
  LeaseCache::InsertResult r = cache_.Insert(fresh);
  EXPECT_TRUE(r.inserted);
  ASSERT_EQ(r.to_release.size(), 1u);
  EXPECT_EQ(r.to_release[0], old);
  EXPECT_EQ(cache_.FindByName("ns/a", ViewKind::kPrivate, 2), fresh);
  delete old;
  fresh->Unref();
  fresh->Unref();
  for (LeaseView* v : queue_->PopAll()) {
    EXPECT_EQ(cache_.Dispose(v, Clock::now(), /*closing=*/true), Disposition::kRelease);
    delete v;
  }
}

TEST(LeaseCacheNoCacheTest, WithTheCacheOffNothingIsKept) {
  auto queue = NewQueue();
  LeaseCache cache(false, milliseconds(2000));
  LeaseView* view = NamedView(queue, 1, "ns/a");
  cache.Insert(view);
  EXPECT_EQ(cache.FindByName("ns/a", ViewKind::kPrivate, 0), nullptr);
  DropToZero(queue, view);
  EXPECT_EQ(cache.Dispose(view, Clock::now(), false), Disposition::kRelease);
  EXPECT_EQ(cache.held_count(), 0u);
  delete view;
}

}  // namespace
}  // namespace tensord::internal
