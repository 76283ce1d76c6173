#include "client/release_queue.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "client/dlpack_context.h"
#include "client/lease_view.h"
#include "gtest/gtest.h"
#include "tests/unit/client/test_views.h"

namespace tensord::internal {
namespace {

using std::chrono::milliseconds;
using testing::NewBareView;
using testing::NewPatternMapping;
using testing::NewQueue;
using Clock = std::chrono::steady_clock;

// Records every batch; can be made to block inside ProcessBatch (a slow broker).
class RecordingSink : public ReleaseSink {
 public:
  void ProcessBatch(std::vector<LeaseView*> views, std::vector<uint64_t> lease_ids) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      entered_++;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !blocked_; });
      if (views.empty() && lease_ids.empty()) {
        empty_batches_++;
      } else {
        sizes_.push_back(views.size());
        times_.push_back(Clock::now());
        for (LeaseView* v : views) seen_.push_back(v->tensor_id());
        ids_.insert(ids_.end(), lease_ids.begin(), lease_ids.end());
      }
      cv_.notify_all();
    }
    for (LeaseView* v : views) delete v;
  }
  Clock::time_point Tick(Clock::time_point) override { return Clock::time_point::max(); }

  void Block() {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_ = true;
  }
  void Unblock() {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_ = false;
    cv_.notify_all();
  }
  void WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_ >= n; });
  }
  // Waits until `n` views were seen (or 10 s).
  bool WaitSeen(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return seen_.size() >= n; });
  }
  std::vector<size_t> sizes() {
    std::lock_guard<std::mutex> lock(mu_);
    return sizes_;
  }
  std::vector<uint64_t> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  std::vector<uint64_t> ids() {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_;
  }
  std::vector<Clock::time_point> times() {
    std::lock_guard<std::mutex> lock(mu_);
    return times_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool blocked_ = false;
  int entered_ = 0;
  int empty_batches_ = 0;
  std::vector<size_t> sizes_;
  std::vector<uint64_t> seen_;
  std::vector<uint64_t> ids_;
  std::vector<Clock::time_point> times_;
};

TEST(ReleaseQueueTest, ASingleReleaseGoesOutOnItsOwnOnceItsWindowCloses) {
  auto queue = NewQueue();
  RecordingSink sink;
  const ReleaseSender::Options options{};
  ReleaseSender sender(queue, &sink, options);
  LeaseView* view = NewBareView(queue, 7);
  const auto start = Clock::now();
  view->Unref();
  // No flush, no further release and no full batch: the window alone sends it.
  ASSERT_TRUE(sink.WaitSeen(1)) << "a lone release was never sent";
  EXPECT_EQ(sink.sizes(), std::vector<size_t>{1});
  EXPECT_EQ(sink.seen(), std::vector<uint64_t>{7});
  // Not before the window closed (how soon after is for the benchmarks).
  EXPECT_GE(sink.times()[0] - start, options.max_delay);
}

TEST(ReleaseQueueTest, ReleasesWithinTheWindowShareOneBatch) {
  auto queue = NewQueue();
  RecordingSink sink;
  ReleaseSender::Options options;
  options.max_delay = milliseconds(50);  // a wide window so the test does not race it
  ReleaseSender sender(queue, &sink, options);
  std::vector<LeaseView*> views;
  for (uint64_t i = 0; i < 20; ++i) views.push_back(NewBareView(queue, i));
  for (LeaseView* v : views) v->Unref();
  ASSERT_TRUE(sink.WaitSeen(20));
  EXPECT_EQ(sink.sizes(), std::vector<size_t>{20});
}

TEST(ReleaseQueueTest, ReleasesWithinAWindowWakeTheSenderOnce) {
  auto queue = NewQueue();
  RecordingSink sink;
  ReleaseSender::Options options;
  options.max_delay = std::chrono::seconds(30);  // the window stays open for the whole test
  ReleaseSender sender(queue, &sink, options);
  for (uint64_t i = 0; i < 100; ++i) {
    NewBareView(queue, i)->Unref();
    // Give the sender time to react, as it would between releases of a real loop.
    if (i % 10 == 0) std::this_thread::sleep_for(milliseconds(2));
  }
  // The first push found the stack empty; the collecting sender left the others on it.
  EXPECT_EQ(queue->wakes_for_test(), 1u);
  EXPECT_TRUE(sink.sizes().empty());
  ASSERT_TRUE(sender.Flush(std::chrono::seconds(10)));
  EXPECT_EQ(sink.sizes(), std::vector<size_t>{100});
}

TEST(ReleaseQueueTest, ThePushThatFillsABatchWakesTheSender) {
  auto queue = NewQueue();
  RecordingSink sink;
  ReleaseSender::Options options;
  options.max_delay = std::chrono::seconds(30);
  ReleaseSender sender(queue, &sink, options);
  NewBareView(queue, 0)->Unref();
  std::this_thread::sleep_for(milliseconds(20));  // the sender is collecting now
  for (uint64_t i = 1; i < 256; ++i) NewBareView(queue, i)->Unref();
  // Without that wake-up the batch would wait out the 30 s window.
  ASSERT_TRUE(sink.WaitSeen(256));
  EXPECT_EQ(sink.sizes(), std::vector<size_t>{256});
  // The first push and the filling one (fewer if the sender was slow to start collecting).
  EXPECT_LE(queue->wakes_for_test(), 2u);
}

TEST(ReleaseQueueTest, AFullBatchOf256IsSentWithoutWaitingAndBatchesNeverExceedIt) {
  auto queue = NewQueue();
  RecordingSink sink;
  ReleaseSender::Options options;
  options.max_delay = std::chrono::seconds(30);  // only the size limit can end a batch
  ReleaseSender sender(queue, &sink, options);
  std::vector<LeaseView*> views;
  for (uint64_t i = 0; i < 600; ++i) views.push_back(NewBareView(queue, i));
  for (LeaseView* v : views) v->Unref();
  // WaitSeen gives up after 10 s, well inside the window: only full batches can be seen.
  ASSERT_TRUE(sink.WaitSeen(512)) << "full batches waited for the window";
  EXPECT_EQ(sink.sizes(), (std::vector<size_t>{256, 256}));
  // The remaining 88 wait for the window (30 s) or a flush.
  EXPECT_EQ(sink.seen().size(), 512u);
  ASSERT_TRUE(sender.Flush(std::chrono::seconds(10)));
  EXPECT_EQ(sink.sizes(), (std::vector<size_t>{256, 256, 88}));
  EXPECT_EQ(sink.seen().size(), 600u);
}

TEST(ReleaseQueueTest, WhileTheSenderIsBusyReleasesPileUpAndGoOutInChunksOf256) {
  auto queue = NewQueue();
  RecordingSink sink;
  ReleaseSender sender(queue, &sink, {});
  sink.Block();
  NewBareView(queue, 0)->Unref();
  sink.WaitEntered(1);  // the sender is stuck in a (slow) send
  std::vector<LeaseView*> views;
  for (uint64_t i = 1; i <= 600; ++i) views.push_back(NewBareView(queue, i));
  for (LeaseView* v : views) v->Unref();
  sink.Unblock();
  ASSERT_TRUE(sink.WaitSeen(601));
  std::vector<size_t> sizes = sink.sizes();
  EXPECT_EQ(sizes, (std::vector<size_t>{1, 256, 256, 88}));
  // Oldest first.
  std::vector<uint64_t> seen = sink.seen();
  for (uint64_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
}

TEST(ReleaseQueueTest, LeaseIdsWithoutViewsAreSentToo) {
  auto queue = NewQueue();
  RecordingSink sink;
  ReleaseSender sender(queue, &sink, {});
  queue->PushLeaseIds({11, 12});
  ASSERT_TRUE(sender.Flush(std::chrono::seconds(10)));
  EXPECT_EQ(sink.ids(), (std::vector<uint64_t>{11, 12}));
}

TEST(ReleaseQueueTest, TheLockFreeStackLosesAndDuplicatesNothingUnderManyThreads) {
  auto queue = NewQueue();
  RecordingSink sink;
  ReleaseSender sender(queue, &sink, {});
  constexpr int kThreads = 8;
  constexpr uint64_t kPerThread = 5000;
  std::vector<std::vector<LeaseView*>> views(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    for (uint64_t i = 0; i < kPerThread; ++i) views[t].push_back(NewBareView(queue, t * kPerThread + i));
  }
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) {
      }
      for (LeaseView* v : views[t]) v->Unref();
    });
  }
  go.store(true);
  for (auto& th : threads) th.join();
  ASSERT_TRUE(sink.WaitSeen(kThreads * kPerThread));
  ASSERT_TRUE(sender.Flush(std::chrono::seconds(10)));
  std::vector<uint64_t> seen = sink.seen();
  ASSERT_EQ(seen.size(), kThreads * kPerThread);
  std::vector<int> count(kThreads * kPerThread, 0);
  for (uint64_t id : seen) count[id]++;
  for (size_t i = 0; i < count.size(); ++i) ASSERT_EQ(count[i], 1) << "view " << i;
  for (size_t s : sink.sizes()) EXPECT_LE(s, 256u);
  // Wake-ups happen only when a push finds the stack empty, not once per push.
  EXPECT_LT(queue->wakes_for_test(), kThreads * kPerThread);
}

TEST(ReleaseQueueTest, DeletersDoNotBlockWhileTheSenderIsStuck) {
  auto queue = NewQueue();
  RecordingSink sink;
  ReleaseSender sender(queue, &sink, {});
  sink.Block();
  NewBareView(queue, 0)->Unref();
  sink.WaitEntered(1);
  LeaseView* view = NewBareView(queue, 1);
  std::vector<DLManagedTensor*> tensors;
  for (int i = 0; i < 1000; ++i) tensors.push_back(MakeDLPack(view));
  view->Unref();  // the DLPack views hold it now
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < tensors.size(); i += 8) {
        tensors[i]->deleter(tensors[i]);
        done.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();  // would hang here if a deleter waited on the sender
  EXPECT_EQ(done.load(), 1000);
  sink.Unblock();
  ASSERT_TRUE(sink.WaitSeen(2));
}

TEST(ReleaseQueueTest, AfterStopDeletersFreeInlineFromAnyThreadWithoutTheSender) {
  auto queue = NewQueue();
  std::weak_ptr<Mapping> weak;
  std::vector<DLManagedTensor*> legacy;
  std::vector<DLManagedTensorVersioned*> versioned;
  const uint8_t* data = nullptr;
  {
    RecordingSink sink;
    auto sender = std::make_unique<ReleaseSender>(queue, &sink, ReleaseSender::Options{});
    LeaseView::Params p;
    p.info.tensor_id = 1;
    p.info.shape = {4096};
    p.info.strides = {1};
    p.lease_id = 5;
    p.mapping = NewPatternMapping(4096, common::MapMode::kPrivate);
    weak = p.mapping;
    auto* view = new LeaseView(std::move(p), queue);
    data = view->data();
    for (int i = 0; i < 64; ++i) {
      legacy.push_back(MakeDLPack(view));
      versioned.push_back(MakeDLPackVersioned(view));
    }
    view->Unref();
    sender.reset();  // the "Client" is gone: sender stopped, queue stopped
  }
  ASSERT_TRUE(queue->stopped());
  ASSERT_FALSE(weak.expired());
  queue.reset();  // only the views keep the queue alive now
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < legacy.size(); i += 8) {
        EXPECT_EQ(static_cast<const uint8_t*>(legacy[i]->dl_tensor.data)[3], 3);
        legacy[i]->deleter(legacy[i]);
        versioned[i]->deleter(versioned[i]);
      }
    });
  }
  for (auto& th : threads) th.join();
  // The last deleter unmapped inline, on its own thread.
  EXPECT_TRUE(weak.expired());
  EXPECT_FALSE(testing::IsMapped(data));
}

TEST(ReleaseQueueTest, FlushOnAStoppedSenderReturnsAtOnce) {
  auto queue = NewQueue();
  RecordingSink sink;
  ReleaseSender sender(queue, &sink, {});
  sender.Stop();
  EXPECT_TRUE(sender.Flush(std::chrono::seconds(1)));
}

}  // namespace
}  // namespace tensord::internal
