#include "server/state/wait_queue.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensord::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

Waiter AcquireName(uint64_t session, const std::string& name, uint64_t min_generation = 0) {
  Waiter waiter;
  waiter.session_id = session;
  waiter.kind = Waiter::Kind::kAcquireName;
  waiter.target = name;
  waiter.min_generation = min_generation;
  return waiter;
}

Waiter AcquireId(uint64_t session, uint64_t tensor_id) {
  Waiter waiter;
  waiter.session_id = session;
  waiter.kind = Waiter::Kind::kAcquireId;
  waiter.tensor_id = tensor_id;
  return waiter;
}

Waiter Take(uint64_t session, const std::string& name_or_prefix) {
  Waiter waiter;
  waiter.session_id = session;
  waiter.kind = Waiter::Kind::kTake;
  waiter.target = name_or_prefix;
  return waiter;
}

Tensor Bound(uint64_t id, const std::string& name, uint64_t generation) {
  Tensor tensor;
  tensor.id = id;
  tensor.name = name;
  tensor.generation = generation;
  return tensor;
}

TEST(WaitQueueTest, AcquiresComeBeforeTakesAndTakesOldestFirst) {
  WaitQueue queue;
  uint64_t take_old = queue.Add(Take(1, "jobs/a"));
  uint64_t acquire = queue.Add(AcquireName(2, "jobs/a"));
  uint64_t take_prefix = queue.Add(Take(3, "jobs/"));
  uint64_t by_id = queue.Add(AcquireId(4, 7));
  uint64_t take_new = queue.Add(Take(5, "jobs/a"));
  WaitQueue::Matches matches = queue.Match(Bound(7, "jobs/a", 3));
  // Every acquire gets the tensor, whenever it started waiting; then the takes in the order
  // they started: the oldest that may be granted unbinds it.
  EXPECT_THAT(matches.acquires, ElementsAre(acquire, by_id));
  EXPECT_THAT(matches.takes, ElementsAre(take_old, take_prefix, take_new));
  // Matching removes nothing: the broker removes what it grants.
  EXPECT_EQ(queue.size(), 5u);
}

TEST(WaitQueueTest, AnAcquireByNameWaitsForItsGeneration) {
  WaitQueue queue;
  uint64_t any = queue.Add(AcquireName(1, "m/w"));
  uint64_t newer = queue.Add(AcquireName(1, "m/w", 5));
  queue.Add(AcquireName(1, "m/other"));
  EXPECT_THAT(queue.Match(Bound(9, "m/w", 4)).acquires, ElementsAre(any));
  EXPECT_THAT(queue.Match(Bound(9, "m/w", 5)).acquires, ElementsAre(any, newer));
  // An unbound tensor satisfies no name, only its id.
  Tensor unbound = Bound(9, "", 6);
  EXPECT_THAT(queue.Match(unbound).acquires, IsEmpty());
  uint64_t by_id = queue.Add(AcquireId(1, 9));
  EXPECT_THAT(queue.Match(unbound).acquires, ElementsAre(by_id));
}

TEST(WaitQueueTest, APrefixTakeMatchesWholeComponentsOnly) {
  WaitQueue queue;
  uint64_t jobs = queue.Add(Take(1, "jobs/"));
  uint64_t deep = queue.Add(Take(1, "jobs/gpu/"));
  queue.Add(Take(1, "jo/"));
  queue.Add(Take(1, "jobs/gpu"));  // a name, not a prefix: only that exact name
  queue.Add(Take(1, "other/"));
  EXPECT_THAT(queue.Match(Bound(1, "jobs/gpu/x", 1)).takes, ElementsAre(jobs, deep));
  EXPECT_THAT(queue.Match(Bound(2, "jobs/cpu", 2)).takes, ElementsAre(jobs));
  EXPECT_THAT(queue.Match(Bound(3, "", 3)).takes, IsEmpty());
}

TEST(WaitQueueTest, RemovingBySessionAndId) {
  WaitQueue queue;
  uint64_t a = queue.Add(Take(1, "q/"));
  uint64_t b = queue.Add(Take(2, "q/"));
  uint64_t c = queue.Add(AcquireName(1, "q/x"));
  queue.Find(c)->timer_id = 42;
  std::vector<Waiter> removed = queue.RemoveSession(1);
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_EQ(removed[0].kind, Waiter::Kind::kTake);
  EXPECT_EQ(removed[1].timer_id, 42u);
  EXPECT_THAT(queue.Ids(), ElementsAre(b));
  EXPECT_EQ(queue.Find(a), nullptr);
  EXPECT_FALSE(queue.Remove(a).has_value());
  std::optional<Waiter> taken = queue.Remove(b);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->session_id, 2u);
  EXPECT_EQ(queue.size(), 0u);
  // Ids are not reused.
  EXPECT_GT(queue.Add(Take(3, "q/")), c);
}

}  // namespace
}  // namespace tensord::server
