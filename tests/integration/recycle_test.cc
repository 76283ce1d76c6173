// Recycled buffers against the real `tensord` binary: a producer's large tensors in a
// namespace reuse the dedicated buffers of its earlier ones once no lease on those is left,
// never before, so a reader never sees a later tensor through a lease on an earlier one; the
// pool is counted in the quota, taken back before an allocation fails, and freed with its
// session (a producer killed with SIGKILL included). With ClientOptions::allocate_ahead the
// same holds, and a steady producer's next buffer is granted before it asks.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/test_client.h"

namespace tensord {
namespace {

using testing::ChildProcess;
using testing::Connect;
using testing::DaemonProcess;
using testing::PeerArgs;
using namespace std::chrono_literals;

constexpr int64_t kFloats = 3 << 18;  // 3 MiB: above the arena limit, a dedicated buffer
constexpr uint64_t kBytes = kFloats * sizeof(float);

TensorSpec Floats(int64_t count = kFloats) {
  TensorSpec spec;
  spec.shape = {count};
  return spec;
}

// Daemon flags that leave room for two buffers of kBytes (and a little), no more.
std::vector<std::string> RoomForTwoBuffers() {
  return {"--max-host-bytes", std::to_string(2 * kBytes + 4096)};
}

void Fill(const TensorRef& ref, float value) {
  auto* data = static_cast<float*>(ref.mutable_data());
  for (int64_t i = 0; i < ref.info().shape[0]; ++i) data[i] = value;
}

// Whether every element of `ref` is `value`.
bool Holds(const TensorRef& ref, float value) {
  const auto* data = static_cast<const float*>(ref.data());
  for (int64_t i = 0; i < ref.info().shape[0]; ++i) {
    if (data[i] != value) return false;
  }
  return true;
}

BrokerStatus StatusOf(Client& client) {
  auto status = client.GetStatus();
  EXPECT_TRUE(status.ok()) << status.status().ToString();
  return status.ok() ? *status : BrokerStatus{};
}

// Polls (10 s) until `done(status)`; returns whether it came true.
template <typename Pred>
bool AwaitStatus(Client& client, Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done(StatusOf(client))) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

// Allocates, fills with `value` and publishes as `name`; returns the tensor's info.
TensorInfo Produce(Client& producer, const std::string& name, float value) {
  auto tensor = producer.Allocate("r", Floats());
  EXPECT_TRUE(tensor.ok()) << tensor.status().ToString();
  if (!tensor.ok()) return {};
  Fill(*tensor, value);
  auto published = producer.Publish(*tensor, name);
  EXPECT_TRUE(published.ok()) << published.status().ToString();
  return tensor->info();
}

TEST(RecycleTest, ABufferComesBackOnlyOnceItsLastLeaseIsGone) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  auto consumer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  ASSERT_NE(consumer, nullptr);

  const TensorInfo first = Produce(*producer, "r/a", 1.0f);
  EXPECT_TRUE(first.recyclable);
  EXPECT_FALSE(first.arena);
  auto held = consumer->Acquire("r/a");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  // The reader writes into its own copy-on-write pages: they must never reach a later tensor.
  static_cast<float*>(held->mutable_data())[7] = -5.0f;

  // The name goes; the reader's lease keeps the tensor, so its buffer is not recycled.
  ASSERT_TRUE(producer->Delete("r/a").ok());
  const TensorInfo second = Produce(*producer, "r/b", 2.0f);
  EXPECT_NE(second.buffer_id, first.buffer_id);
  EXPECT_FLOAT_EQ(static_cast<const float*>(held->data())[0], 1.0f);
  EXPECT_FLOAT_EQ(static_cast<const float*>(held->data())[kFloats - 1], 1.0f);
  EXPECT_FLOAT_EQ(static_cast<const float*>(held->data())[7], -5.0f);

  // Once the last lease is gone, the next allocation gets the same memory back.
  held->Release();
  ASSERT_TRUE(consumer->Flush().ok());
  ASSERT_TRUE(AwaitStatus(*producer, [](const BrokerStatus& s) { return s.pooled_buffers == 1; }));
  EXPECT_EQ(StatusOf(*producer).host_bytes_pooled, kBytes);
  const TensorInfo third = Produce(*producer, "r/c", 3.0f);
  EXPECT_EQ(third.buffer_id, first.buffer_id);
  EXPECT_TRUE(third.recyclable);
  EXPECT_EQ(StatusOf(*producer).pooled_buffers, 0u);

  // A reader of the new tensor sees its bytes, not the old ones nor its own old writes.
  auto again = consumer->Acquire("r/c");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(Holds(*again, 3.0f));
  auto other = consumer->Acquire("r/b");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(Holds(*other, 2.0f));
}

TEST(RecycleTest, AReadOnlyTakeSeesEachTensorOfARecycledBuffer) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  auto consumer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  ASSERT_NE(consumer, nullptr);
  TakeOptions readonly{.wait = Wait::For(5s), .readonly = true};

  const TensorInfo first = Produce(*producer, "r/q/1", 1.0f);
  ASSERT_TRUE(first.recyclable);
  auto taken = consumer->Take("r/q/", readonly);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_TRUE(taken->readonly());
  EXPECT_EQ(taken->mutable_data(), nullptr);
  DLManagedTensorVersioned* view = taken->ToDLPackVersioned();
  EXPECT_NE(view->flags & kDLFlagBitMaskReadOnly, 0u);
  view->deleter(view);
  EXPECT_TRUE(Holds(*taken, 1.0f));
  taken->Release();
  ASSERT_TRUE(consumer->Flush().ok());
  ASSERT_TRUE(AwaitStatus(*producer, [](const BrokerStatus& s) { return s.pooled_buffers == 1; }));

  // The same memory carries the next tensor; the reader's kept read-only mapping shows it.
  const TensorInfo second = Produce(*producer, "r/q/2", 2.0f);
  ASSERT_EQ(second.buffer_id, first.buffer_id);
  auto batch = consumer->TakeMany("r/q/", 4, readonly);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  ASSERT_EQ(batch->size(), 1u);
  EXPECT_TRUE((*batch)[0].readonly());
  EXPECT_TRUE(Holds((*batch)[0], 2.0f));

  // While the reader holds it, the buffer is not the producer's to reuse.
  const TensorInfo third = Produce(*producer, "r/q/3", 3.0f);
  EXPECT_NE(third.buffer_id, first.buffer_id);
  EXPECT_TRUE(Holds((*batch)[0], 2.0f));
}

TEST(RecycleTest, OnlyTheSameNamespaceAndSessionReuseABuffer) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  auto other = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  ASSERT_NE(other, nullptr);
  auto tensor = producer->Allocate("r", Floats());
  ASSERT_TRUE(tensor.ok());
  const uint64_t buffer = tensor->info().buffer_id;
  tensor->Release();
  ASSERT_TRUE(producer->Flush().ok());
  ASSERT_TRUE(AwaitStatus(*producer, [](const BrokerStatus& s) { return s.pooled_buffers == 1; }));

  auto elsewhere = producer->Allocate("s", Floats());
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_NE(elsewhere->info().buffer_id, buffer);
  auto someone_else = other->Allocate("r", Floats());
  ASSERT_TRUE(someone_else.ok());
  EXPECT_NE(someone_else->info().buffer_id, buffer);
  // A tensor without a namespace may be published anywhere: never recycled.
  auto unnamespaced = producer->Allocate("", Floats());
  ASSERT_TRUE(unnamespaced.ok());
  EXPECT_FALSE(unnamespaced->info().recyclable);
  auto same = producer->Allocate("r", Floats());
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->info().buffer_id, buffer);
}

TEST(RecycleTest, PooledMemoryCountsInTheQuotaAndIsTakenBackBeforeAnAllocationFails) {
  DaemonProcess daemon(RoomForTwoBuffers());
  auto producer = Connect(daemon);
  auto other = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  ASSERT_NE(other, nullptr);
  {
    auto a = producer->Allocate("r", Floats());
    auto b = producer->Allocate("r", Floats());
    ASSERT_TRUE(a.ok() && b.ok());
  }
  ASSERT_TRUE(producer->Flush().ok());
  ASSERT_TRUE(AwaitStatus(*producer, [](const BrokerStatus& s) { return s.pooled_buffers == 2; }));
  EXPECT_EQ(StatusOf(*producer).host_bytes_in_use, 2 * kBytes);

  // Another session needs the memory: the pool gives it up instead of the call failing.
  auto needed = other->Allocate("q", Floats());
  ASSERT_TRUE(needed.ok()) << needed.status().ToString();
  BrokerStatus status = StatusOf(*other);
  EXPECT_EQ(status.pooled_buffers, 1u);
  EXPECT_EQ(status.host_bytes_in_use, 2 * kBytes);
  // Beyond what the pool can give, the quota still says no.
  auto more = other->Allocate("q", Floats());
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  auto too_much = other->Allocate("q", Floats());
  EXPECT_EQ(too_much.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusOf(*other).pooled_buffers, 0u);
}

TEST(RecycleTest, WhenTheNodeIsShortOfMemoryThePoolIsGivenBack) {
  // A quota far above the node's memory: the allocation fails in the host backend itself.
  DaemonProcess daemon({"--max-host-bytes", "64TiB"});
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  {
    auto tensor = producer->Allocate("r", Floats());
    ASSERT_TRUE(tensor.ok());
  }
  ASSERT_TRUE(producer->Flush().ok());
  ASSERT_TRUE(AwaitStatus(*producer, [](const BrokerStatus& s) { return s.pooled_buffers == 1; }));
  auto huge = producer->Allocate("r", Floats(int64_t{1} << 42));  // 16 TiB
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("1 idle recycled buffers were given back"), std::string::npos)
      << huge.status().ToString();
  EXPECT_TRUE(AwaitStatus(*producer, [](const BrokerStatus& s) {
    return s.pooled_buffers == 0 && s.host_bytes_in_use == 0;
  }));
}

TEST(RecycleTest, APoolIsBoundedPerSession) {
  DaemonProcess daemon({"--recycle-buffers-per-session", "2"});
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  {
    std::vector<TensorRef> tensors;
    for (int i = 0; i < 4; ++i) {
      auto tensor = producer->Allocate("r", Floats());
      ASSERT_TRUE(tensor.ok());
      tensors.push_back(std::move(tensor).value());
    }
  }
  ASSERT_TRUE(producer->Flush().ok());
  ASSERT_TRUE(AwaitStatus(*producer, [](const BrokerStatus& s) {
    return s.pooled_buffers == 2 && s.host_bytes_in_use == 2 * kBytes;
  }));
}

TEST(RecycleTest, RecyclingOffFreesEveryBuffer) {
  DaemonProcess daemon({"--recycle-bytes-per-session", "0"});
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  auto tensor = producer->Allocate("r", Floats());
  ASSERT_TRUE(tensor.ok());
  EXPECT_FALSE(tensor->info().recyclable);
  tensor->Release();
  ASSERT_TRUE(producer->Flush().ok());
  ASSERT_TRUE(AwaitStatus(*producer, [](const BrokerStatus& s) { return s.host_bytes_in_use == 0; }));
  EXPECT_EQ(StatusOf(*producer).pooled_buffers, 0u);
}

TEST(RecycleTest, AKilledProducersPoolIsFreed) {
  DaemonProcess daemon;
  auto observer = Connect(daemon);
  ASSERT_NE(observer, nullptr);
  ChildProcess peer(PeerArgs({"recycle", daemon.socket(), "r", std::to_string(kFloats)}));
  const std::string line = peer.WaitForLine("pooled");
  ASSERT_NE(line.find(" 1"), std::string::npos) << line;
  ASSERT_TRUE(AwaitStatus(*observer, [](const BrokerStatus& s) { return s.pooled_buffers == 1; }));
  EXPECT_EQ(StatusOf(*observer).host_bytes_in_use, kBytes);
  peer.Kill(SIGKILL);
  EXPECT_TRUE(AwaitStatus(*observer, [](const BrokerStatus& s) {
    return s.pooled_buffers == 0 && s.host_bytes_in_use == 0 && s.buffers == 0;
  }));
}

std::unique_ptr<Client> ConnectAhead(const DaemonProcess& daemon) {
  ClientOptions options = testing::Options(daemon);
  options.allocate_ahead = true;
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(client).value() : nullptr;
}

TEST(RecycleTest, AllocateAheadGrantsASteadyProducersNextBufferAndKeepsEveryTensorIntact) {
  DaemonProcess daemon;
  auto producer = ConnectAhead(daemon);
  auto consumer = Connect(daemon);
  auto observer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  ASSERT_NE(consumer, nullptr);
  ASSERT_NE(observer, nullptr);

  // The first Allocate is granted a recyclable buffer: the next one is asked for at once.
  const TensorInfo first = Produce(*producer, "r/0", 0.0f);
  ASSERT_TRUE(first.recyclable);
  ASSERT_TRUE(AwaitStatus(*observer, [](const BrokerStatus& s) { return s.tensors == 2; }))
      << "no allocation was sent ahead";
  // A reader holds the first tensor all along: its buffer must never be handed out again.
  auto kept = consumer->Take("r/0");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();

  std::vector<uint64_t> buffers;
  for (int i = 1; i <= 12; ++i) {
    const std::string name = "r/" + std::to_string(i);
    const TensorInfo info = Produce(*producer, name, static_cast<float>(i));
    EXPECT_NE(info.buffer_id, first.buffer_id) << name;
    buffers.push_back(info.buffer_id);
    auto taken = consumer->Take(name);
    ASSERT_TRUE(taken.ok()) << taken.status().ToString();
    EXPECT_TRUE(Holds(*taken, static_cast<float>(i))) << name;
    taken->Release();
    ASSERT_TRUE(consumer->Flush().ok());
  }
  EXPECT_TRUE(Holds(*kept, 0.0f));
  // Steady, the producer cycles through a few buffers: the ahead one and those just freed.
  std::sort(buffers.begin(), buffers.end());
  buffers.erase(std::unique(buffers.begin(), buffers.end()), buffers.end());
  EXPECT_LE(buffers.size(), 3u);

  // The session's end gives the allocation sent ahead back with everything else.
  producer.reset();
  kept->Release();
  ASSERT_TRUE(consumer->Flush().ok());
  EXPECT_TRUE(AwaitStatus(*observer, [](const BrokerStatus& s) {
    return s.tensors == 0 && s.buffers == 0 && s.host_bytes_in_use == 0;
  }));
}

TEST(RecycleTest, AllocateAheadOfAnotherShapeIsReleasedAndMakesRoomWhenMemoryIsShort) {
  DaemonProcess daemon(RoomForTwoBuffers());
  auto producer = ConnectAhead(daemon);
  auto observer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  ASSERT_NE(observer, nullptr);
  auto a = producer->Allocate("r", Floats());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(AwaitStatus(*observer, [](const BrokerStatus& s) {
    return s.tensors == 2 && s.host_bytes_in_use == 2 * kBytes;
  }));
  // Another shape: the early buffer is not it. Its lease goes back, and the memory it held
  // serves this call although the quota was full.
  auto b = producer->Allocate("r", Floats(kFloats / 2));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(b->info().buffer_id, a->info().buffer_id);
  a->Release();
  b->Release();
  ASSERT_TRUE(producer->Flush().ok());
  // Whatever the producer holds now is one allocation sent ahead, at most.
  EXPECT_TRUE(AwaitStatus(*observer, [](const BrokerStatus& s) { return s.tensors <= 1; }));
}

TEST(RecycleTest, AllocateAheadThatFindsNoRoomLeavesTheNextCallToSaySo) {
  DaemonProcess daemon(RoomForTwoBuffers());
  auto producer = ConnectAhead(daemon);
  ASSERT_NE(producer, nullptr);
  auto a = producer->Allocate("r", Floats());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = producer->Allocate("r", Floats());  // the one sent ahead; the next ahead finds no room
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto c = producer->Allocate("r", Floats());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted) << c.status().ToString();
  // Room again: the next call succeeds, in the buffer given back.
  const uint64_t freed = a->info().buffer_id;
  a->Release();
  ASSERT_TRUE(producer->Flush().ok());
  ASSERT_TRUE(AwaitStatus(*producer, [](const BrokerStatus& s) { return s.pooled_buffers == 1; }));
  auto d = producer->Allocate("r", Floats());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->info().buffer_id, freed);
}

}  // namespace
}  // namespace tensord
