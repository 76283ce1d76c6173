#include "common/memory/host/mapped_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <utility>

#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::common {
namespace {

using ::tensord::common::testing::IsOk;
using ::tensord::common::testing::StatusIs;
using ::testing::HasSubstr;

// Whether [addr, addr+size) is mapped at all (msync fails with ENOMEM on holes).
bool IsMapped(void* addr, size_t size) { return msync(addr, size, MS_ASYNC) == 0; }

TEST(MappedRegionTest, MapsSharedAndUnmapsOnDestruction) {
  UniqueFd fd(memfd_create("region", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(fd.get(), 8192), 0);
  void* addr = nullptr;
  {
    auto region = MappedRegion::Map(fd.get(), 8192, MapMode::kSharedWritable, "region");
    ASSERT_THAT(region, IsOk());
    EXPECT_EQ(region->size(), 8192u);
    EXPECT_EQ(region->mode(), MapMode::kSharedWritable);
    region->data()[10] = 7;
    addr = region->data();
    EXPECT_TRUE(IsMapped(addr, 8192));
  }
  EXPECT_FALSE(IsMapped(addr, 8192));
  char byte = 0;
  ASSERT_EQ(pread(fd.get(), &byte, 1, 10), 1);
  EXPECT_EQ(byte, 7);
}

TEST(MappedRegionTest, MoveTransfersOwnership) {
  UniqueFd fd(memfd_create("region", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(fd.get(), 4096), 0);
  auto region = MappedRegion::Map(fd.get(), 4096, MapMode::kSharedReadOnly, "region");
  ASSERT_THAT(region, IsOk());
  MappedRegion moved = std::move(*region);
  EXPECT_FALSE(region->valid());
  ASSERT_TRUE(moved.valid());
  void* addr = moved.data();
  MappedRegion assigned;
  assigned = std::move(moved);
  EXPECT_FALSE(moved.valid());
  EXPECT_EQ(assigned.data(), addr);
  EXPECT_TRUE(IsMapped(addr, 4096));
  assigned.reset();
  EXPECT_FALSE(assigned.valid());
  EXPECT_FALSE(IsMapped(addr, 4096));
}

TEST(MappedRegionTest, PrivateWritesStayPrivate) {
  UniqueFd fd(memfd_create("region", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(fd.get(), 4096), 0);
  auto priv = MappedRegion::Map(fd.get(), 4096, MapMode::kPrivate, "private");
  auto shared = MappedRegion::Map(fd.get(), 4096, MapMode::kSharedReadOnly, "shared");
  ASSERT_THAT(priv, IsOk());
  ASSERT_THAT(shared, IsOk());
  priv->data()[0] = 1;
  EXPECT_EQ(shared->data()[0], 0);
}

TEST(MappedRegionTest, RefusesZeroSizeAndBadFd) {
  EXPECT_THAT(MappedRegion::Map(0, 0, MapMode::kPrivate, "empty"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mmap empty: size 0")));
  EXPECT_THAT(MappedRegion::Map(-1, 4096, MapMode::kPrivate, "bad"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mmap bad")));
}

}  // namespace
}  // namespace tensord::common
