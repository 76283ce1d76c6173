// LeaseAdopter::OrderOnStream / Ordered: a consumer's views are ordered on the caller's stream
// before the Session returns them, and a failure gives every reference back. Device views
// here are a BorrowedRegion with a fake StreamOrder; no driver, no broker.
#include "client/lease_adopter.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/memory/importer.h"
#include "common/memory/stream_order.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/client/test_views.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::internal {
namespace {

using common::testing::IsOk;
using common::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::NewBareView;
using testing::NewQueue;

class DoneAtOnce final : public common::DoneFence {
 public:
  bool Complete() override { return true; }
  void Wait() override {}
};

// Records each stream made to wait; refuses the streams in `failing`.
class FakeStreamOrder final : public common::StreamOrder {
 public:
  absl::StatusOr<std::string> RecordReady(int32_t, uintptr_t, const std::string&) const override {
    return std::string("ready");
  }
  absl::Status WaitReady(const common::ReadyFence&, int32_t, uintptr_t stream,
                         const std::string& what) const override {
    waited.push_back(stream);
    if (failing.count(stream) != 0) return absl::InternalError(what + ": the driver refused");
    return absl::OkStatus();
  }
  absl::Status WaitReadyOnHost(const common::ReadyFence&, int32_t, const std::string&) const override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<common::DoneFence>> RecordDone(int32_t, uintptr_t,
                                                                const std::string&) const override {
    return std::unique_ptr<common::DoneFence>(new DoneAtOnce());
  }
  absl::Status CopyOnStream(void*, const void*, uint64_t, int32_t, uintptr_t, const std::string&) const override {
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void*, const void*, uint64_t, int32_t, const std::string&) const override {
    return absl::UnimplementedError("no copies here");
  }
  absl::Status CopyFromHost(void*, const void*, uint64_t, int32_t, const std::string&) const override {
    return absl::UnimplementedError("no copies here");
  }

  std::set<uintptr_t> failing;
  mutable std::vector<uintptr_t> waited;
};

// A view of "device" memory ordered by `order`, with a ready fence to wait for.
LeaseView* NewDeviceView(const std::shared_ptr<ReleaseQueue>& queue, uint64_t id, const FakeStreamOrder& order,
                         std::vector<uint8_t>& memory) {
  LeaseView::Params p;
  p.info.tensor_id = id;
  p.info.shape = {static_cast<int64_t>(memory.size())};
  p.info.strides = {1};
  p.lease_id = 1000 + id;
  p.kind = ViewKind::kReadOnly;
  p.mapping = std::make_shared<Mapping>(std::make_unique<common::BorrowedRegion>(
      memory.data(), memory.size(), common::MapMode::kSharedReadOnly, 0, &order, nullptr));
  p.ready_fence = "fence";
  return new LeaseView(std::move(p), queue);
}

constexpr uintptr_t kStream = 7;

TEST(LeaseAdopterOrderTest, DeviceViewsWaitOnTheStreamAndHostViewsCostNothing) {
  auto queue = NewQueue();
  FakeStreamOrder order;
  std::vector<uint8_t> memory(64);
  LeaseView* host = NewBareView(queue, 1);
  LeaseView* device = NewDeviceView(queue, 2, order, memory);
  ASSERT_FALSE(host->stream_ordered());
  ASSERT_TRUE(device->stream_ordered());

  absl::StatusOr<std::vector<LeaseView*>> views =
      LeaseAdopter::Ordered(std::vector<LeaseView*>{host, device}, kStream);
  ASSERT_THAT(views.status(), IsOk());
  EXPECT_THAT(*views, ElementsAre(host, device));
  EXPECT_THAT(order.waited, ElementsAre(kStream));
  EXPECT_EQ(host->refs(), 1u);
  EXPECT_EQ(device->refs(), 1u);
  delete host;
  delete device;
}

TEST(LeaseAdopterOrderTest, AFailureGivesBackEveryReference) {
  auto queue = NewQueue();
  FakeStreamOrder order;
  order.failing = {kStream};
  std::vector<uint8_t> memory(64);
  LeaseView* host = NewBareView(queue, 1);
  LeaseView* device = NewDeviceView(queue, 2, order, memory);

  absl::StatusOr<std::vector<LeaseView*>> views =
      LeaseAdopter::Ordered(std::vector<LeaseView*>{host, device}, kStream);
  EXPECT_THAT(views.status(), StatusIs(absl::StatusCode::kInternal, HasSubstr("tensor 2: the driver refused")));
  // Both references went back: the views are on their way to the release sender.
  std::vector<LeaseView*> released = queue->PopAll();
  EXPECT_EQ(released.size(), 2u);
  for (LeaseView* view : released) delete view;
}

TEST(LeaseAdopterOrderTest, OneViewAsACallReturnsIt) {
  auto queue = NewQueue();
  FakeStreamOrder order;
  std::vector<uint8_t> memory(64);
  LeaseView* device = NewDeviceView(queue, 3, order, memory);
  EXPECT_THAT(LeaseAdopter::Ordered(device, kLegacyDefaultStream).status(), IsOk());
  EXPECT_THAT(order.waited, ElementsAre(kLegacyDefaultStream));

  order.failing = {kStream};
  EXPECT_THAT(LeaseAdopter::Ordered(device, kStream).status(), StatusIs(absl::StatusCode::kInternal, HasSubstr("tensor 3")));
  std::vector<LeaseView*> released = queue->PopAll();
  ASSERT_EQ(released.size(), 1u);
  delete released[0];

  // An error passes through untouched, with nothing to order.
  EXPECT_THAT(LeaseAdopter::Ordered(absl::StatusOr<LeaseView*>(absl::NotFoundError("gone")), kStream).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("gone")));
}

}  // namespace
}  // namespace tensord::internal
