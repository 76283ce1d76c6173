// Publish with `desc`: a tensor allocated ahead of time as a plain slot (the client's
// allocation pool) is described when it is published.
#include <unistd.h>

#include <future>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/memory/arena.h"
#include "tests/unit/common/status_matchers.h"
#include "tests/unit/server/broker_fixture.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;
using common::testing::IsOk;
using common::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::TensorDesc Desc(v1::DTypeCode code, uint32_t bits, std::vector<int64_t> shape) {
  v1::TensorDesc desc;
  desc.mutable_dtype()->set_code(code);
  desc.mutable_dtype()->set_bits(bits);
  desc.mutable_dtype()->set_lanes(1);
  for (int64_t d : shape) desc.add_shape(d);
  desc.mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
  return desc;
}

class PublishDescTest : public testing::BrokerTest {
 protected:
  PublishDescTest() {
    Start([](BrokerOptions& options) {
      options.arena_bytes = 1 << 20;
      options.arena_max_tensor_bytes = 256 << 10;
    });
  }

  // A pool entry: a plain uint8 vector of `bytes`, sealed as the producer's client does.
  v1::AllocateResponse AllocateSlot(uint64_t session, const std::string& ns, int64_t bytes,
                                    bool isolated = false) {
    v1::AllocateRequest request;
    request.set_ns(ns);
    request.set_isolated(isolated);
    *request.mutable_desc() = Desc(v1::DTYPE_CODE_UINT, 8, {bytes});
    std::promise<absl::StatusOr<v1::AllocateResponse>> promise;
    broker_->Allocate(session, request,
                      [&](absl::StatusOr<v1::AllocateResponse> r) { promise.set_value(std::move(r)); });
    absl::StatusOr<v1::AllocateResponse> allocated = promise.get_future().get();
    EXPECT_THAT(allocated, IsOk());
    Seal(session, *allocated);
    return *allocated;
  }

  absl::StatusOr<v1::PublishResponse> PublishAs(uint64_t session, uint64_t tensor_id,
                                                const std::string& name, const v1::TensorDesc& desc) {
    v1::PublishRequest request;
    request.set_tensor_id(tensor_id);
    request.set_name(name);
    *request.mutable_desc() = desc;
    return broker_->Publish(session, request);
  }

  v1::TensorInfo StatOf(uint64_t session, uint64_t tensor_id) {
    v1::StatRequest request;
    request.set_tensor_id(tensor_id);
    absl::StatusOr<v1::StatResponse> stat = broker_->Stat(session, request);
    EXPECT_THAT(stat, IsOk());
    return stat.ok() ? stat->tensor() : v1::TensorInfo();
  }
};

TEST_F(PublishDescTest, ADescThatFitsTheSlotIsWhatEveryoneSeesFromThePublishOn) {
  uint64_t producer = Open();
  uint64_t reader = Open();
  v1::AllocateResponse slot = AllocateSlot(producer, "ns", 8192);
  ASSERT_TRUE(slot.tensor().buffer().arena());
  const uint64_t id = slot.tensor().tensor_id();
  // 3 x 500 float32 = 6000 bytes in an 8 KiB slot.
  absl::StatusOr<v1::PublishResponse> published =
      PublishAs(producer, id, "ns/x", Desc(v1::DTYPE_CODE_FLOAT, 32, {3, 500}));
  ASSERT_THAT(published, IsOk());
  EXPECT_EQ(published->tensor().desc().dtype().code(), v1::DTYPE_CODE_FLOAT);
  EXPECT_EQ(published->tensor().nbytes(), 6000u);
  EXPECT_EQ(published->tensor().buffer().extent(), 6000u);
  EXPECT_EQ(published->tensor().buffer().offset(), slot.tensor().buffer().offset());

  v1::TensorInfo stat = StatOf(producer, id);
  EXPECT_EQ(stat.state(), v1::TENSOR_STATE_SEALED);
  EXPECT_THAT(stat.desc().shape(), ::testing::ElementsAre(3, 500));
  EXPECT_THAT(stat.desc().strides(), ::testing::ElementsAre(500, 1));
  absl::StatusOr<v1::AcquireResponse> acquired = Acquire(reader, "ns/x");
  ASSERT_THAT(acquired, IsOk());
  EXPECT_EQ(acquired->tensor().desc().dtype().bits(), 32u);
  EXPECT_THAT(acquired->tensor().desc().shape(), ::testing::ElementsAre(3, 500));
  EXPECT_EQ(acquired->tensor().nbytes(), 6000u);
  // The quota still counts the arena once, whatever its slots hold.
  EXPECT_EQ(broker_->GetStatus().host_bytes_in_use(), kFirstArenaBytes);
}

TEST_F(PublishDescTest, AnExtentPastTheSlotIsRefusedAndChangesNothing) {
  uint64_t producer = Open();
  v1::AllocateResponse slot = AllocateSlot(producer, "ns", ArenaAlignment());
  const uint64_t id = slot.tensor().tensor_id();
  const uint64_t too_many = ArenaAlignment() / 4 + 1;  // float32: one element past the slot
  absl::StatusOr<v1::PublishResponse> published = PublishAs(
      producer, id, "ns/x", Desc(v1::DTYPE_CODE_FLOAT, 32, {static_cast<int64_t>(too_many)}));
  EXPECT_THAT(published, StatusIs(absl::StatusCode::kInvalidArgument,
                                  AllOf(HasSubstr("desc: extent of " + std::to_string(too_many * 4)),
                                        HasSubstr(std::to_string(ArenaAlignment()) + "-byte"),
                                        HasSubstr("arena slot"))));
  // A byte_offset counts in the extent too.
  v1::TensorDesc shifted = Desc(v1::DTYPE_CODE_UINT, 8, {static_cast<int64_t>(ArenaAlignment())});
  shifted.set_byte_offset(1);
  EXPECT_THAT(PublishAs(producer, id, "ns/x", shifted),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc: extent of")));

  v1::TensorInfo stat = StatOf(producer, id);
  EXPECT_EQ(stat.state(), v1::TENSOR_STATE_CREATING);
  EXPECT_EQ(stat.desc().dtype().code(), v1::DTYPE_CODE_UINT);
  EXPECT_THAT(stat.desc().shape(), ::testing::ElementsAre(ArenaAlignment()));
  EXPECT_EQ(stat.name(), "");
  v1::StatRequest by_name;
  by_name.set_name("ns/x");
  EXPECT_THAT(broker_->Stat(producer, by_name), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  // The slot can still be published as it is, or with a description that fits exactly.
  EXPECT_THAT(PublishAs(producer, id, "ns/x",
                        Desc(v1::DTYPE_CODE_FLOAT, 32, {static_cast<int64_t>(too_many - 1)})),
              IsOk());
}

TEST_F(PublishDescTest, ABadDescIsRefusedAsAllocateRefusesItNamingTheField) {
  uint64_t producer = Open();
  v1::AllocateResponse slot = AllocateSlot(producer, "ns", 4096);
  const uint64_t id = slot.tensor().tensor_id();
  EXPECT_THAT(PublishAs(producer, id, "ns/x", Desc(v1::DTYPE_CODE_FLOAT, 32, {2, -1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.shape[1] is -1")));
  EXPECT_THAT(PublishAs(producer, id, "ns/x", Desc(static_cast<v1::DTypeCode>(77), 32, {4})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.dtype")));
  v1::TensorDesc on_gpu = Desc(v1::DTYPE_CODE_FLOAT, 32, {4});
  on_gpu.mutable_device()->set_type(v1::DEVICE_TYPE_CUDA);
  EXPECT_THAT(PublishAs(producer, id, "ns/x", on_gpu),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("was allocated on DEVICE_TYPE_CPU device 0, not DEVICE_TYPE_CUDA device 0")));
  v1::TensorDesc other_cpu = Desc(v1::DTYPE_CODE_FLOAT, 32, {4});
  other_cpu.mutable_device()->set_index(1);
  EXPECT_THAT(PublishAs(producer, id, "ns/x", other_cpu),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("desc.device")));
  // No elements, but a slot: clients would refuse what they get.
  EXPECT_THAT(PublishAs(producer, id, "ns/x", Desc(v1::DTYPE_CODE_FLOAT, 32, {0})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no elements")));
  v1::TensorInfo stat = StatOf(producer, id);
  EXPECT_EQ(stat.state(), v1::TENSOR_STATE_CREATING);
  EXPECT_THAT(stat.desc().shape(), ::testing::ElementsAre(4096));
}

TEST_F(PublishDescTest, APublishedTensorCannotBeDescribedAgain) {
  uint64_t producer = Open();
  v1::AllocateResponse slot = AllocateSlot(producer, "ns", 4096);
  const uint64_t id = slot.tensor().tensor_id();
  ASSERT_THAT(PublishAs(producer, id, "ns/x", Desc(v1::DTYPE_CODE_FLOAT, 32, {8})), IsOk());
  EXPECT_THAT(PublishAs(producer, id, "ns/y", Desc(v1::DTYPE_CODE_FLOAT, 64, {8})),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already published")));
  EXPECT_EQ(StatOf(producer, id).desc().dtype().bits(), 32u);
  // Nor can another session describe (or publish) what it did not allocate.
  uint64_t other = Open();
  v1::AllocateResponse mine = AllocateSlot(producer, "ns", 4096);
  EXPECT_THAT(PublishAs(other, mine.tensor().tensor_id(), "ns/z", Desc(v1::DTYPE_CODE_FLOAT, 32, {8})),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST_F(PublishDescTest, ADedicatedBufferBoundsTheDescByItsSize) {
  uint64_t producer = Open();
  // Isolated: its own buffer of whole pages (5000 bytes -> 8 KiB).
  v1::AllocateResponse own = AllocateSlot(producer, "ns", 5000, /*isolated=*/true);
  ASSERT_FALSE(own.tensor().buffer().arena());
  const uint64_t size = own.tensor().buffer().size();
  ASSERT_EQ(size, 8192u);
  const uint64_t id = own.tensor().tensor_id();
  EXPECT_THAT(PublishAs(producer, id, "ns/x", Desc(v1::DTYPE_CODE_UINT, 8, {static_cast<int64_t>(size) + 1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("extent of " + std::to_string(size + 1)),
                             HasSubstr(std::to_string(size) + "-byte"), HasSubstr("its buffer"))));
  EXPECT_EQ(StatOf(producer, id).state(), v1::TENSOR_STATE_CREATING);
  absl::StatusOr<v1::PublishResponse> published =
      PublishAs(producer, id, "ns/x", Desc(v1::DTYPE_CODE_FLOAT, 64, {static_cast<int64_t>(size / 8)}));
  ASSERT_THAT(published, IsOk());
  EXPECT_EQ(published->tensor().nbytes(), size);
  // A dedicated buffer counts by its size, as before.
  EXPECT_EQ(broker_->GetStatus().host_bytes_in_use(), size);
}

TEST_F(PublishDescTest, AZeroByteTensorHasNoRegionForElements) {
  uint64_t producer = Open();
  auto empty = Allocate(producer, "ns", 0);
  ASSERT_THAT(empty, IsOk());
  const uint64_t id = empty->tensor().tensor_id();
  EXPECT_THAT(PublishAs(producer, id, "ns/x", Desc(v1::DTYPE_CODE_FLOAT, 32, {1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0-byte region")));
  EXPECT_THAT(PublishAs(producer, id, "ns/x", Desc(v1::DTYPE_CODE_INT, 64, {0, 3})), IsOk());
  EXPECT_THAT(StatOf(producer, id).desc().shape(), ::testing::ElementsAre(0, 3));
}

}  // namespace
}  // namespace tensord::server
