// The absl::Mutex annotations of a ThreadSanitizer build (tsan_absl_annotations.cc): data
// handed over under each kind of absl::Mutex operation is not reported as a race (the test
// runs with halt_on_error=1, so a report fails it), and an unsynchronized access still is.
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace {

TEST(TsanAbslAnnotations, LockAndUnlockOrderWriters) {
  absl::Mutex mu;
  int counter = 0;
  auto add = [&] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock lock(&mu);
      ++counter;
    }
  };
  std::thread a(add), b(add);
  a.join();
  b.join();
  EXPECT_EQ(counter, 2000);
}

TEST(TsanAbslAnnotations, ReaderLocksAreOrderedAfterWritersAndBeforeTheNextWriter) {
  absl::Mutex mu;
  int value = 0;
  std::vector<int> seen(4);
  std::thread writer([&] {
    for (int i = 1; i <= 200; ++i) {
      absl::MutexLock lock(&mu);
      value = i;
    }
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&, r] {
      for (int i = 0; i < 200; ++i) {
        absl::ReaderMutexLock lock(&mu);
        seen[r] = value;
      }
    });
  }
  writer.join();
  for (std::thread& reader : readers) reader.join();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(value, 200);
}

TEST(TsanAbslAnnotations, TryLockOrdersWhenItSucceeds) {
  absl::Mutex mu;
  int counter = 0;
  auto add = [&] {
    for (int done = 0; done < 300;) {
      if (mu.TryLock()) {
        ++counter;
        ++done;
        mu.Unlock();
      }
    }
  };
  std::thread a(add), b(add);
  a.join();
  b.join();
  EXPECT_EQ(counter, 600);
}

TEST(TsanAbslAnnotations, AwaitSeesWhatWasWrittenBeforeTheConditionBecameTrue) {
  absl::Mutex mu;
  bool ready = false;
  int payload = 0;  // written outside the mutex, before the handoff
  std::thread producer([&] {
    absl::SleepFor(absl::Milliseconds(20));  // so the consumer really waits
    payload = 42;
    absl::MutexLock lock(&mu);
    ready = true;
  });
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&ready));
  }
  EXPECT_EQ(payload, 42);
  producer.join();
}

TEST(TsanAbslAnnotations, AwaitWithTimeoutAndLockWhenOrderTheHandoff) {
  absl::Mutex mu;
  bool ready = false;
  int payload = 0;
  std::thread producer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    payload = 1;
    absl::MutexLock lock(&mu);
    ready = true;
  });
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(30)));
  }
  EXPECT_EQ(payload, 1);
  producer.join();

  ready = false;
  std::thread second([&] {
    absl::SleepFor(absl::Milliseconds(20));
    payload = 2;
    absl::MutexLock lock(&mu);
    ready = true;
  });
  EXPECT_TRUE(mu.LockWhenWithTimeout(absl::Condition(&ready), absl::Seconds(30)));
  mu.Unlock();
  EXPECT_EQ(payload, 2);
  second.join();
}

TEST(TsanAbslAnnotations, CondVarWaitSeesWhatWasWrittenBeforeTheSignal) {
  absl::Mutex mu;
  absl::CondVar cv;
  bool ready = false;
  int payload = 0;
  std::thread producer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    payload = 7;
    absl::MutexLock lock(&mu);
    ready = true;
    cv.Signal();
  });
  {
    absl::MutexLock lock(&mu);
    while (!ready) cv.WaitWithTimeout(&mu, absl::Seconds(30));
  }
  EXPECT_EQ(payload, 7);
  producer.join();
}

// Two unsynchronized increments from two threads; not inlined, so both are real accesses.
__attribute__((noinline)) void Increment(int* value) { ++*value; }

void RaceThenExitZero() {
  int value = 0;
  std::thread a(Increment, &value);
  std::thread b(Increment, &value);
  a.join();
  b.join();
  std::exit(0);  // reached only when TSan did not halt on the race
}

TEST(TsanAbslAnnotationsDeathTest, AnUnsynchronizedAccessIsStillReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // TSan's exit code for a report is 66 (halt_on_error=1 exits at once).
  EXPECT_EXIT(RaceThenExitZero(), ::testing::ExitedWithCode(66), "ThreadSanitizer: data race");
}

}  // namespace
