// CancelToken against the real daemon: a cancelled wait ends at once and leaves no waiter at
// the broker, and a grant that races the cancel leaves no lease held. Only the public client
// API is used here.
#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/publish_filled.h"
#include "tests/integration/test_client.h"

namespace tensord {
namespace {

using testing::Connect;
using testing::DaemonProcess;
using testing::PublishFilled;
using testing::WaitForWaiting;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The waiting count the broker reports for `session_id` now.
uint64_t WaitingNow(Client& observer, uint64_t session_id) {
  auto status = observer.GetStatus(StatusOptions{.sessions = true});
  EXPECT_TRUE(status.ok()) << status.status().ToString();
  if (!status.ok()) return ~uint64_t{0};
  for (const SessionUsage& usage : status->session_usage) {
    if (usage.id == session_id) return usage.waiting;
  }
  return 0;
}

TEST(Cancel, ACancelledForeverWaitReturnsCancelledAndTheBrokerKeepsNoWaiter) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  auto observer = Connect(daemon);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(observer, nullptr);
  CancelToken token;
  AcquireOptions options;
  options.wait = Wait::Forever();
  options.cancel = &token;
  auto waiting = std::async(std::launch::async, [&] { return client->Acquire("ns/never", options); });
  ASSERT_TRUE(WaitForWaiting(*observer, client->session_id(), 1));
  const Clock::time_point cancelled_at = Clock::now();
  token.Cancel();
  ASSERT_EQ(waiting.wait_for(5s), std::future_status::ready);
  Result<TensorRef> result = waiting.get();
  EXPECT_LT(Clock::now() - cancelled_at, 2s);
  EXPECT_EQ(result.status().code(), StatusCode::kCancelled) << result.status().ToString();
  // It returned once the broker had dropped the wait: nothing is left to poll for.
  EXPECT_EQ(WaitingNow(*observer, client->session_id()), 0u);

  // The session goes on: a later publish is not sent to the cancelled wait.
  ASSERT_TRUE(PublishFilled(*observer, "ns/never", 4, 1.0f).ok());
  ASSERT_TRUE(observer->Flush().ok());
  auto stat = observer->Stat("ns/never");
  ASSERT_TRUE(stat.ok());
  for (const LeaseHolder& holder : stat->holders) EXPECT_NE(holder.session_id, client->session_id());
  EXPECT_TRUE(client->Acquire("ns/never").ok());
}

TEST(Cancel, TakesAndBatchesAreCancelledToo) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  auto observer = Connect(daemon);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(observer, nullptr);
  CancelToken token;
  TakeOptions take;
  take.wait = Wait::Forever();
  take.cancel = &token;
  AcquireOptions acquire;
  acquire.wait = Wait::For(60s);
  acquire.cancel = &token;
  // One token, three calls waiting at once.
  auto taking = std::async(std::launch::async, [&] { return client->Take("q/", take); });
  auto batch_taking = std::async(std::launch::async, [&] { return client->TakeMany("r/", 8, take); });
  auto acquiring = std::async(std::launch::async, [&] {
    return client->AcquireMany({"ns/a", "ns/b", "ns/c"}, acquire);
  });
  ASSERT_TRUE(WaitForWaiting(*observer, client->session_id(), 5));
  token.Cancel();
  EXPECT_EQ(taking.get().status().code(), StatusCode::kCancelled);
  EXPECT_EQ(batch_taking.get().status().code(), StatusCode::kCancelled);
  EXPECT_EQ(acquiring.get().status().code(), StatusCode::kCancelled);
  EXPECT_EQ(WaitingNow(*observer, client->session_id()), 0u);

  // Cancelled already: a later call returns at once, asking nothing of the broker.
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(client->Take("q/", take).status().code(), StatusCode::kCancelled);
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_TRUE(token.cancelled());
}

TEST(Cancel, APollCancelsOnTheWaitingThread) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  auto observer = Connect(daemon);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(observer, nullptr);
  std::atomic<int> polls{0};
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> other_thread{false};
  CancelToken token(
      [&] {
        if (std::this_thread::get_id() != caller) other_thread = true;
        return ++polls >= 5;
      },
      20ms);
  AcquireOptions options;
  options.wait = Wait::Forever();
  options.cancel = &token;
  const Clock::time_point start = Clock::now();
  Result<TensorRef> result = client->Acquire("ns/never", options);
  EXPECT_EQ(result.status().code(), StatusCode::kCancelled) << result.status().ToString();
  EXPECT_EQ(polls.load(), 5);
  EXPECT_FALSE(other_thread.load());
  EXPECT_GE(Clock::now() - start, 90ms);
  EXPECT_EQ(WaitingNow(*observer, client->session_id()), 0u);

  // An answer that comes before the first period costs no poll.
  polls = 0;
  CancelToken quiet([&] { return ++polls > 0; }, 10s);
  ASSERT_TRUE(PublishFilled(*observer, "ns/there", 4, 2.0f).ok());
  options.cancel = &quiet;
  EXPECT_TRUE(client->Acquire("ns/there", options).ok());
  EXPECT_EQ(polls.load(), 0);
}

// The broker grants the wait before the cancel reaches it (the poll publishes the tensor and
// only then cancels): the call still returns CANCELLED, and the lease it was granted goes.
TEST(Cancel, AGrantThatRacesTheCancelIsReleased) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  auto producer = Connect(daemon);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(producer, nullptr);
  for (bool take : {false, true}) {
    SCOPED_TRACE(take ? "take" : "acquire");
    const std::string name = take ? "ns/raced-take" : "ns/raced";
    std::atomic<bool> published{false};
    CancelToken token(
        [&] {
          if (!WaitForWaiting(*producer, client->session_id(), 1)) return false;
          published = PublishFilled(*producer, name, 4, 1.0f).ok();
          return true;  // after the broker granted the waiter
        },
        20ms);
    Result<TensorRef> result = take ? client->Take(name, TakeOptions{.wait = Wait::Forever(), .cancel = &token})
                                    : client->Acquire(name, AcquireOptions{.wait = Wait::Forever(), .cancel = &token});
    ASSERT_TRUE(published.load());
    EXPECT_EQ(result.status().code(), StatusCode::kCancelled) << result.status().ToString();
    ASSERT_TRUE(client->Flush().ok());
    ASSERT_TRUE(producer->Flush().ok());
    // Nobody holds it: not the producer (its TensorRef is gone), not the cancelled caller.
    auto stat = producer->Stat(name);
    if (take) {
      EXPECT_EQ(stat.status().code(), StatusCode::kNotFound);  // the take unbound it
    } else {
      ASSERT_TRUE(stat.ok()) << stat.status().ToString();
      EXPECT_TRUE(testing::WaitForHolders(*producer, stat->info.tensor_id, 0, 5s));
    }
    auto status = producer->GetStatus(StatusOptions{.sessions = true});
    ASSERT_TRUE(status.ok());
    for (const SessionUsage& usage : status->session_usage) {
      if (usage.id == client->session_id()) {
        EXPECT_EQ(usage.leases, 0u);
        EXPECT_EQ(usage.waiting, 0u);
      }
    }
  }
}

}  // namespace
}  // namespace tensord
