// The client's allocation pool against the real `tensord` binary: small Allocate calls in a
// namespace are served from arena slots allocated ahead of time and described at publish,
// and nothing a caller sees changes (shapes, bytes, errors, what the broker frees).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/test_client.h"

namespace tensord {
namespace {

using testing::Connect;
using testing::DaemonProcess;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

TensorSpec Spec(DLDataType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
  TensorSpec spec;
  spec.dtype = dtype;
  spec.shape = std::move(shape);
  spec.strides = std::move(strides);
  return spec;
}

// Bytes from element 0 to the end of the last reachable element.
uint64_t Extent(const TensorInfo& info) {
  uint64_t last = 0;
  for (size_t d = 0; d < info.shape.size(); ++d) {
    last += static_cast<uint64_t>(info.shape[d] - 1) * static_cast<uint64_t>(info.strides[d]);
  }
  return (last + 1) * info.dtype.bits / 8;
}

void FillPattern(const TensorRef& ref, int seed) {
  auto* data = static_cast<uint8_t*>(ref.mutable_data());
  ASSERT_NE(data, nullptr);
  for (uint64_t k = 0; k < Extent(ref.info()); ++k) data[k] = static_cast<uint8_t>(seed * 31 + k * 7);
}

bool HasPattern(const TensorRef& ref, int seed) {
  const auto* data = static_cast<const uint8_t*>(ref.data());
  for (uint64_t k = 0; k < Extent(ref.info()); ++k) {
    if (data[k] != static_cast<uint8_t>(seed * 31 + k * 7)) return false;
  }
  return true;
}

BrokerStatus StatusOf(Client& client) {
  auto status = client.GetStatus();
  EXPECT_TRUE(status.ok()) << status.status().ToString();
  return status.ok() ? *status : BrokerStatus{};
}

// Polls until the broker holds `leases` leases (a closed session goes asynchronously).
bool AwaitLeases(Client& observer, uint64_t leases) {
  for (int i = 0; i < 200; ++i) {
    if (StatusOf(observer).leases == leases) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Shapes of every slot class (1, 2 and 4 pages; 3 pages is an odd size), one strided.
std::vector<TensorSpec> MixedSpecs() {
  return {
      Spec(dtypes::kFloat32, {16}),                // 64 bytes: 1 page
      Spec(dtypes::kInt16, {3000}),                // 6000 bytes: 2 pages
      Spec(dtypes::kUInt8, {3 * 4096}),            // 3 pages: the 4-page class
      Spec(dtypes::kFloat64, {1000}),              // 8000 bytes: 2 pages
      Spec(dtypes::kInt64, {2, 1024}),             // 16 KiB: 4 pages
      Spec(dtypes::kFloat32, {4, 4}, {8, 1}),      // strided, 112-byte extent
      Spec(dtypes::kUInt8, {64 << 10}),            // 64 KiB: the largest class
  };
}

TEST(AllocationPool, PooledTensorsCarryTheirOwnShapeAndBytesToAnotherClient) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  auto consumer = Connect(daemon);
  const std::vector<TensorSpec> kinds = MixedSpecs();
  constexpr int kCount = 70;
  std::vector<TensorRef> refs;
  for (int i = 0; i < kCount; ++i) {
    const TensorSpec& spec = kinds[i % kinds.size()];
    auto ref = producer->Allocate("pool", spec);
    ASSERT_TRUE(ref.ok()) << i << ": " << ref.status().ToString();
    // What a caller sees is the spec, whatever slot it came from.
    EXPECT_EQ(ref->info().shape, spec.shape) << i;
    EXPECT_EQ(ref->info().dtype.code, spec.dtype.code) << i;
    EXPECT_EQ(ref->info().dtype.bits, spec.dtype.bits) << i;
    if (!spec.strides.empty()) {
      EXPECT_EQ(ref->info().strides, spec.strides) << i;
    }
    EXPECT_EQ(ref->info().state, TensorState::kCreating);
    EXPECT_TRUE(ref->info().arena) << i;
    EXPECT_EQ(ref->info().lease_count, 1u);
    FillPattern(*ref, i);
    refs.push_back(std::move(*ref));
  }
  // Slots made ahead of time: the broker holds more tensors (and producer leases) than
  // the caller has.
  BrokerStatus status = StatusOf(*producer);
  EXPECT_GT(status.tensors, static_cast<uint64_t>(kCount));
  EXPECT_EQ(status.leases, status.tensors);

  for (int i = 0; i < kCount; ++i) {
    const std::string name = "pool/t" + std::to_string(i);
    auto info = producer->Publish(refs[i], name);
    ASSERT_TRUE(info.ok()) << name << ": " << info.status().ToString();
    EXPECT_EQ(info->shape, refs[i].info().shape);
    EXPECT_EQ(info->strides, refs[i].info().strides);
    EXPECT_EQ(info->nbytes, refs[i].info().nbytes);
    EXPECT_EQ(info->state, TensorState::kSealed);
  }
  for (int i = 0; i < kCount; ++i) {
    const std::string name = "pool/t" + std::to_string(i);
    const TensorSpec& spec = kinds[i % kinds.size()];
    auto got = consumer->Acquire(name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
    EXPECT_EQ(got->info().shape, spec.shape) << name;
    EXPECT_EQ(got->info().dtype.code, spec.dtype.code) << name;
    EXPECT_EQ(got->info().dtype.bits, spec.dtype.bits) << name;
    EXPECT_EQ(got->info().strides, refs[i].info().strides) << name;
    EXPECT_TRUE(HasPattern(*got, i)) << name;
    auto stat = consumer->Stat(name);
    ASSERT_TRUE(stat.ok());
    EXPECT_EQ(stat->info.shape, spec.shape) << name;
  }
}

TEST(AllocationPool, DroppedUnpublishedTensorsAndAClosedProducerLeaveNoLease) {
  DaemonProcess daemon;
  auto observer = Connect(daemon);
  auto producer = Connect(daemon);
  std::vector<TensorRef> refs;
  for (int i = 0; i < 20; ++i) {
    auto ref = producer->Allocate("pool", Spec(dtypes::kFloat32, {16 + i}));
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    refs.push_back(std::move(*ref));
  }
  const BrokerStatus held = StatusOf(*observer);
  ASSERT_GT(held.leases, 20u);  // the pool's own slots
  const uint64_t pooled = held.leases - 20;
  // Published ones keep their binding; dropped ones are freed like any unpublished tensor.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(producer->Publish(refs[i], "pool/kept" + std::to_string(i)).ok());
  refs.clear();
  ASSERT_TRUE(producer->Flush().ok());
  BrokerStatus after = StatusOf(*observer);
  EXPECT_EQ(after.leases, pooled);
  EXPECT_EQ(after.tensors, pooled + 5);
  EXPECT_EQ(after.named_tensors, 5u);

  // Closing the producer gives back every slot still in its pool.
  producer.reset();
  EXPECT_TRUE(AwaitLeases(*observer, 0)) << StatusOf(*observer).leases << " leases left";
  after = StatusOf(*observer);
  EXPECT_EQ(after.tensors, 5u);
  auto kept = observer->Acquire("pool/kept4");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->info().shape, std::vector<int64_t>{20});
}

TEST(AllocationPool, WithArenasOffEveryAllocateIsAPlainOne) {
  DaemonProcess daemon({"--arena-bytes", "0"});
  auto producer = Connect(daemon);
  auto consumer = Connect(daemon);
  std::vector<TensorRef> refs;
  for (int i = 0; i < 10; ++i) {
    auto ref = producer->Allocate("pool", Spec(dtypes::kFloat32, {16}));
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    EXPECT_FALSE(ref->info().arena);
    FillPattern(*ref, i);
    refs.push_back(std::move(*ref));
  }
  // The one refill tried got dedicated buffers and gave them back: nothing else is held.
  ASSERT_TRUE(producer->Flush().ok());
  BrokerStatus status = StatusOf(*consumer);
  EXPECT_EQ(status.leases, 10u);
  EXPECT_EQ(status.tensors, 10u);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(producer->Publish(refs[i], "pool/t" + std::to_string(i)).ok());
    auto got = consumer->Acquire("pool/t" + std::to_string(i));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(HasPattern(*got, i));
  }
}

// A quota of one 64 KiB arena holds sixteen 4 KiB slots, pool or no pool, and the call
// that finds it full gets the broker's own error.
TEST(AllocationPool, AFullQuotaGivesTheBrokersErrorAtTheSameCall) {
  DaemonProcess daemon({"--arena-bytes", "64KiB", "--arena-max-tensor", "64KiB",
                        "--max-host-bytes", "64KiB"});
  auto producer = Connect(daemon);
  std::vector<TensorRef> refs;
  Status error;
  for (int i = 0; i < 40 && error.ok(); ++i) {
    auto ref = producer->Allocate("q", Spec(dtypes::kFloat32, {1024}));
    if (!ref.ok()) {
      error = ref.status();
    } else {
      refs.push_back(std::move(*ref));
    }
  }
  EXPECT_EQ(refs.size(), 16u);
  EXPECT_EQ(error.code(), StatusCode::kResourceExhausted) << error.ToString();
  EXPECT_THAT(error.message(), HasSubstr("allocating a new arena for namespace 'q'"));
  EXPECT_THAT(error.message(), HasSubstr("--max-host-bytes"));
  // Every slot is the caller's: nothing is left over in the pool.
  ASSERT_TRUE(producer->Flush().ok());
  EXPECT_EQ(StatusOf(*producer).leases, 16u);
}

// Slots the pool keeps idle in one class never cost another class its room: eight 4 KiB
// tensors leave room for four 8 KiB ones in a 64 KiB arena, pool or no pool.
TEST(AllocationPool, IdleSlotsAreGivenBackBeforeAnAllocationRunsOutOfRoom) {
  DaemonProcess daemon({"--arena-bytes", "64KiB", "--arena-max-tensor", "64KiB",
                        "--max-host-bytes", "64KiB"});
  auto producer = Connect(daemon);
  std::vector<TensorRef> refs;
  for (int i = 0; i < 8; ++i) {
    auto ref = producer->Allocate("q", Spec(dtypes::kFloat32, {1024}));
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    refs.push_back(std::move(*ref));
  }
  for (int i = 0; i < 4; ++i) {
    auto ref = producer->Allocate("q", Spec(dtypes::kFloat32, {2048}));
    ASSERT_TRUE(ref.ok()) << i << ": " << ref.status().ToString();
    refs.push_back(std::move(*ref));
  }
  auto full = producer->Allocate("q", Spec(dtypes::kFloat32, {2048}));
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted) << full.status().ToString();
  ASSERT_TRUE(producer->Flush().ok());
  EXPECT_EQ(StatusOf(*producer).leases, 12u);
}

// A forked child connects anew and never touches its parent's pool; the parent's pooled
// slots stay usable.
TEST(AllocationPool, AForkedChildLeavesItsParentsPoolAlone) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  std::vector<TensorRef> refs;
  for (int i = 0; i < 4; ++i) {
    auto ref = producer->Allocate("pool", Spec(dtypes::kFloat32, {16}));
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    refs.push_back(std::move(*ref));
  }
  const uint64_t leases_before = StatusOf(*producer).leases;
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int failures = 0;
    for (int i = 0; i < 3; ++i) {
      auto ref = producer->Allocate("pool", Spec(dtypes::kFloat32, {16}));
      if (!ref.ok()) {
        ++failures;
        continue;
      }
      FillPattern(*ref, 100 + i);
      if (!producer->Publish(*ref, "pool/child" + std::to_string(i)).ok()) ++failures;
    }
    _exit(failures == 0 ? 0 : 1);
  }
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;
  // The child's session is gone with it; the parent holds what it held before.
  auto observer = Connect(daemon);
  EXPECT_TRUE(AwaitLeases(*observer, leases_before));
  for (int i = 0; i < 8; ++i) {
    auto ref = producer->Allocate("pool", Spec(dtypes::kFloat32, {16}));
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    FillPattern(*ref, i);
    auto info = producer->Publish(*ref, "pool/parent" + std::to_string(i));
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    auto got = observer->Acquire("pool/parent" + std::to_string(i));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(HasPattern(*got, i));
  }
  for (int i = 0; i < 3; ++i) {
    auto got = observer->Acquire("pool/child" + std::to_string(i));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(HasPattern(*got, 100 + i));
  }
}

}  // namespace
}  // namespace tensord
