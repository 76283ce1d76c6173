// Bounded work queues: QueueSlots on its own, then the Broker's slots (QueueSlot in
// AllocateRequest) from allocation to take, with every way a tensor leaves a queue and every
// way a wait for room ends.
#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/state/queue_slots.h"
#include "server/state/wait_queue.h"
#include "tests/unit/server/broker_fixture.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;
using namespace std::chrono_literals;

// A waiter of `session_id` for a slot of `prefix` at `depth`.
SlotWaiter WaiterOf(const std::string& prefix, uint32_t depth, uint64_t session_id, std::vector<int>* order = nullptr,
                    int tag = 0) {
  SlotWaiter waiter;
  waiter.session_id = session_id;
  waiter.request.mutable_queue()->set_prefix(prefix);
  waiter.request.mutable_queue()->set_depth(depth);
  if (order != nullptr) {
    waiter.done = [order, tag](absl::StatusOr<v1::AllocateResponse>) { order->push_back(tag); };
  }
  return waiter;
}

TEST(QueueSlots, HoldsUpToTheDepthAskedThenWaitersGoFirstOldestFirst) {
  QueueSlots slots;
  EXPECT_TRUE(slots.TryHold("q/", 2));
  EXPECT_TRUE(slots.TryHold("q/", 2));
  EXPECT_FALSE(slots.TryHold("q/", 2));
  EXPECT_TRUE(slots.TryHold("other/", 1));  // queues are counted apart
  const uint64_t first = slots.Wait(WaiterOf("q/", 2, 7));
  const uint64_t second = slots.Wait(WaiterOf("q/", 2, 8));
  EXPECT_GE(first, QueueSlots::kFirstWaitId);  // never a WaitQueue id
  EXPECT_GT(second, first);
  EXPECT_TRUE(slots.Admit("q/").empty());  // still full
  slots.Free("q/");
  // A new allocation does not jump the line while someone waits.
  EXPECT_FALSE(slots.TryHold("q/", 5));
  std::vector<SlotWaiter> admitted = slots.Admit("q/");
  ASSERT_EQ(admitted.size(), 1u);
  EXPECT_EQ(admitted[0].session_id, 7u);
  EXPECT_EQ(slots.waiters(), 1u);
  EXPECT_EQ(slots.Find(first), nullptr);
  ASSERT_NE(slots.Find(second), nullptr);
  std::vector<QueueSlots::QueueState> states = slots.States();
  ASSERT_EQ(states.size(), 2u);
  EXPECT_EQ(states[0].prefix, "other/");
  EXPECT_EQ(states[1].prefix, "q/");
  EXPECT_EQ(states[1].held, 2u);
  EXPECT_EQ(states[1].waiting, 1u);
}

TEST(QueueSlots, EachWaiterWaitsForItsOwnDepthAndAnIdleQueueIsForgotten) {
  QueueSlots slots;
  ASSERT_TRUE(slots.TryHold("q/", 1));
  slots.Wait(WaiterOf("q/", 1, 1));
  slots.Wait(WaiterOf("q/", 3, 2));
  slots.Free("q/");
  // Both fit once the only slot is free: the first takes it, the second asked for depth 3.
  std::vector<SlotWaiter> admitted = slots.Admit("q/");
  ASSERT_EQ(admitted.size(), 2u);
  EXPECT_EQ(admitted[0].session_id, 1u);
  EXPECT_EQ(admitted[1].session_id, 2u);
  slots.Free("q/");
  slots.Free("q/");
  EXPECT_TRUE(slots.States().empty());
}

TEST(QueueSlots, RemovingAWaiterBySessionOrIdLeavesTheRest) {
  QueueSlots slots;
  ASSERT_TRUE(slots.TryHold("q/", 1));
  const uint64_t a = slots.Wait(WaiterOf("q/", 1, 1));
  slots.Wait(WaiterOf("q/", 1, 2));
  slots.Wait(WaiterOf("q/", 1, 1));
  EXPECT_EQ(slots.RemoveSession(1).size(), 2u);
  EXPECT_FALSE(slots.Remove(a).has_value());  // gone with its session
  EXPECT_EQ(slots.waiters(), 1u);
  EXPECT_EQ(slots.RemoveAll().size(), 1u);
  slots.Free("q/");
  EXPECT_TRUE(slots.States().empty());
}

class BrokerQueueTest : public testing::BrokerTest {
 protected:
  static v1::AllocateRequest QueueRequest(const std::string& prefix, uint32_t depth,
                                          std::optional<uint64_t> timeout_ms = std::nullopt, int64_t count = 16) {
    v1::AllocateRequest request = Float32Request(prefix.substr(0, prefix.find('/')), count);
    request.mutable_queue()->set_prefix(prefix);
    request.mutable_queue()->set_depth(depth);
    if (timeout_ms) {
      request.mutable_queue()->set_timeout_ms(*timeout_ms);
    } else {
      request.mutable_queue()->set_forever(true);
    }
    return request;
  }

  // An allocation that may wait: its wait id and its answer to come.
  struct Pending {
    uint64_t wait_id = 0;
    std::future<absl::StatusOr<v1::AllocateResponse>> answer;
  };
  Pending StartAllocate(uint64_t session, const v1::AllocateRequest& request) {
    auto promise = std::make_shared<std::promise<absl::StatusOr<v1::AllocateResponse>>>();
    Pending pending;
    pending.answer = promise->get_future();
    pending.wait_id = broker_->Allocate(session, request, [promise](absl::StatusOr<v1::AllocateResponse> r) {
      promise->set_value(std::move(r));
    });
    return pending;
  }

  // Allocates in `prefix` (depth), seals and publishes under `name`, keeping the producer's lease.
  v1::AllocateResponse PublishInQueue(uint64_t session, const std::string& prefix, uint32_t depth,
                                      const std::string& name) {
    auto allocated = Allocate(session, QueueRequest(prefix, depth, 0));
    EXPECT_TRUE(allocated.ok()) << allocated.status();
    if (!allocated.ok()) return {};
    Seal(session, *allocated);
    auto published = Publish(session, allocated->tensor().tensor_id(), name);
    EXPECT_TRUE(published.ok()) << published.status();
    return *allocated;
  }

  absl::StatusOr<v1::AcquireResponse> Take(uint64_t session, const std::string& target) {
    v1::TakeRequest take;
    take.set_name_or_prefix(target);
    std::promise<absl::StatusOr<v1::AcquireResponse>> promise;
    broker_->Take(session, take, [&](absl::StatusOr<v1::AcquireResponse> r) { promise.set_value(std::move(r)); });
    return promise.get_future().get();
  }

  std::optional<v1::QueueStatus> QueueState(const std::string& prefix) {
    v1::StatusRequest request;
    request.set_include_queues(true);
    const v1::StatusResponse status = broker_->GetStatus(request);
    for (const v1::QueueStatus& queue : status.queues()) {
      if (queue.prefix() == prefix) return queue;
    }
    return std::nullopt;
  }

  // A full queue's allocation without a wait fails at once.
  void ExpectFull(uint64_t session, const std::string& prefix, uint32_t depth) {
    auto refused = Allocate(session, QueueRequest(prefix, depth, 0));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  }
};

TEST_F(BrokerQueueTest, ASlotIsHeldFromAllocationUntilTheTensorIsTaken) {
  const uint64_t producer = Open();
  const uint64_t consumer = Open();
  v1::AllocateResponse first = PublishInQueue(producer, "jobs/", 2, "jobs/a");
  auto second = Allocate(producer, QueueRequest("jobs/", 2, 0));  // being written: holds a slot too
  ASSERT_TRUE(second.ok()) << second.status();
  ExpectFull(producer, "jobs/", 2);
  std::optional<v1::QueueStatus> state = QueueState("jobs/");
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->depth(), 2u);
  EXPECT_EQ(state->slots_held(), 2u);
  EXPECT_EQ(state->published(), 1u);
  // The producer letting go of its lease does not free the slot: the binding holds it.
  Release(producer, first.lease_id());
  ExpectFull(producer, "jobs/", 2);
  auto taken = Take(consumer, "jobs/");
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->tensor().tensor_id(), first.tensor().tensor_id());
  EXPECT_TRUE(Allocate(producer, QueueRequest("jobs/", 2, 0)).ok());
}

TEST_F(BrokerQueueTest, AFullQueueHoldsItsProducerUntilATakeMakesRoomOldestWaiterFirst) {
  const uint64_t producer = Open();
  const uint64_t other = Open();
  const uint64_t consumer = Open();
  PublishInQueue(producer, "jobs/", 1, "jobs/a");
  Pending first = StartAllocate(producer, QueueRequest("jobs/", 1));
  Pending second = StartAllocate(other, QueueRequest("jobs/", 1));
  EXPECT_GE(first.wait_id, QueueSlots::kFirstWaitId);
  EXPECT_EQ(first.answer.wait_for(100ms), std::future_status::timeout);
  EXPECT_EQ(QueueState("jobs/")->producers_waiting(), 2u);
  ASSERT_TRUE(Take(consumer, "jobs/").ok());
  ASSERT_EQ(first.answer.wait_for(5s), std::future_status::ready);
  absl::StatusOr<v1::AllocateResponse> granted = first.answer.get();
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(second.answer.wait_for(100ms), std::future_status::timeout);  // the first one's tensor fills the queue
  // It goes without being published: its slot goes to the next waiter.
  Release(producer, granted->lease_id());
  ASSERT_EQ(second.answer.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(second.answer.get().ok());
}

TEST_F(BrokerQueueTest, DeleteAndTtlTakeATensorOutOfItsQueue) {
  const uint64_t producer = Open();
  v1::AllocateResponse a = PublishInQueue(producer, "jobs/", 1, "jobs/a");
  Release(producer, a.lease_id());
  Delete(producer, "jobs/a");
  auto b = Allocate(producer, QueueRequest("jobs/", 1, 0));
  ASSERT_TRUE(b.ok()) << b.status();
  Seal(producer, *b);
  v1::PublishRequest publish;
  publish.set_tensor_id(b->tensor().tensor_id());
  publish.set_name("jobs/b");
  publish.set_ttl_ms(50);
  ASSERT_TRUE(broker_->Publish(producer, publish).ok());
  Pending waiting = StartAllocate(producer, QueueRequest("jobs/", 1, 5000));
  ASSERT_EQ(waiting.answer.wait_for(5s), std::future_status::ready);  // the TTL unbound jobs/b
  EXPECT_TRUE(waiting.answer.get().ok());
}

TEST_F(BrokerQueueTest, ATensorInAQueueIsPublishedOnlyDirectlyUnderItsPrefix) {
  const uint64_t producer = Open();
  auto allocated = Allocate(producer, QueueRequest("jobs/", 4, 0));
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  Seal(producer, *allocated);
  const uint64_t id = allocated->tensor().tensor_id();
  for (const std::string name : {"jobs/x/y", "jobs", "jobsx/a", ""}) {
    auto refused = Publish(producer, id, name);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << name;
    if (!name.empty()) {
      EXPECT_NE(refused.status().message().find("publish it directly under 'jobs/'"), std::string::npos)
          << refused.status();
    }
  }
  EXPECT_TRUE(Publish(producer, id, "jobs/x").ok());
}

TEST_F(BrokerQueueTest, BadQueuesAreRefusedNamingWhatIsWrong) {
  const uint64_t session = Open();
  v1::AllocateRequest no_slash = QueueRequest("jobs/", 1, 0);
  no_slash.mutable_queue()->set_prefix("jobs");
  EXPECT_EQ(Allocate(session, no_slash).status().code(), absl::StatusCode::kInvalidArgument);
  v1::AllocateRequest other_ns = QueueRequest("jobs/", 1, 0);
  other_ns.set_ns("else");
  auto refused = Allocate(session, other_ns);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("allocate in its namespace 'jobs'"), std::string::npos)
      << refused.status();
  for (uint32_t depth : {0u, 65537u}) {
    v1::AllocateRequest bad_depth = QueueRequest("jobs/", depth, 0);
    EXPECT_EQ(Allocate(session, bad_depth).status().code(), absl::StatusCode::kInvalidArgument) << depth;
  }
  EXPECT_FALSE(QueueState("jobs/").has_value());  // nothing was counted
}

TEST_F(BrokerQueueTest, AWaitForRoomEndsAtItsTimeoutOnCancelAndWithItsSession) {
  const uint64_t producer = Open();
  PublishInQueue(producer, "jobs/", 1, "jobs/a");
  Pending timed = StartAllocate(producer, QueueRequest("jobs/", 1, 30));
  ASSERT_EQ(timed.answer.wait_for(5s), std::future_status::ready);
  absl::StatusOr<v1::AllocateResponse> late = timed.answer.get();
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.status().message().find("no room in queue 'jobs/'"), std::string::npos) << late.status();

  Pending cancelled = StartAllocate(producer, QueueRequest("jobs/", 1));
  broker_->CancelWait(cancelled.wait_id);
  ASSERT_EQ(cancelled.answer.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(cancelled.answer.get().status().code(), absl::StatusCode::kCancelled);

  const uint64_t other = Open();
  Pending closed = StartAllocate(other, QueueRequest("jobs/", 1));
  broker_->CloseSession(other);
  ASSERT_EQ(closed.answer.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(closed.answer.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(QueueState("jobs/")->producers_waiting(), 0u);
}

TEST_F(BrokerQueueTest, AProducerThatGoesFreesTheSlotsOfWhatItWasWritingNotOfWhatItPublished) {
  const uint64_t producer = Open();
  const uint64_t waiter = Open();
  PublishInQueue(producer, "jobs/", 2, "jobs/a");
  ASSERT_TRUE(Allocate(producer, QueueRequest("jobs/", 2, 0)).ok());
  Pending waiting = StartAllocate(waiter, QueueRequest("jobs/", 2));
  broker_->CloseSession(producer);
  ASSERT_EQ(waiting.answer.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(waiting.answer.get().ok());
  std::optional<v1::QueueStatus> state = QueueState("jobs/");
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->slots_held(), 2u);  // jobs/a, still bound, and the waiter's
  EXPECT_EQ(state->published(), 1u);
}

TEST_F(BrokerQueueTest, AFailedAllocationGivesItsSlotBack) {
  const uint64_t producer = Open();
  // Over the broker's 64 MiB: refused after the slot was taken.
  auto refused = Allocate(producer, QueueRequest("jobs/", 1, 0, int64_t{1} << 25));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_FALSE(QueueState("jobs/").has_value());
  EXPECT_TRUE(Allocate(producer, QueueRequest("jobs/", 1, 0)).ok());
}

TEST_F(BrokerQueueTest, StatusShowsQueuesOnlyWhereTheCallerMayRead) {
  const uint64_t owner = Open();
  PublishInQueue(owner, "jobs/", 3, "jobs/a");
  const uint64_t stranger = Open(4343);
  v1::StatusRequest request;
  request.set_include_queues(true);
  EXPECT_EQ(broker_->GetStatus(request, owner).queues_size(), 1);
  EXPECT_EQ(broker_->GetStatus(request, stranger).queues_size(), 0);
  EXPECT_EQ(broker_->GetStatus(v1::StatusRequest(), owner).queues_size(), 0);  // only when asked
}

TEST_F(BrokerQueueTest, ATakeOverCarriesTheQueueAsFullAsItWas) {
  const uint64_t producer = Open();
  PublishInQueue(producer, "jobs/", 1, "jobs/a");
  Broker::Snapshot snapshot = broker_->FreezeAndSnapshot();
  Start([](BrokerOptions&) {});
  Broker::RestoreReport report = broker_->Restore(snapshot.registry, std::move(snapshot.fds));
  ASSERT_EQ(report.tensors, 1u);
  const uint64_t again = Open();
  ExpectFull(again, "jobs/", 1);
  ASSERT_TRUE(Take(again, "jobs/").ok());
  EXPECT_TRUE(Allocate(again, QueueRequest("jobs/", 1, 0)).ok());
}

}  // namespace
}  // namespace tensord::server
