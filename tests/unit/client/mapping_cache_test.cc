#include "client/mapping_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "common/memory/memfd.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/client/test_views.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::internal {
namespace {

using common::MapMode;
using common::testing::StatusIs;
using ::testing::HasSubstr;

// A fetch function over a real sealed memfd that counts its calls and remembers the fd
// numbers it handed out (to check that they were closed).
class FakeBroker {
 public:
  explicit FakeBroker(uint64_t size) : size_(size) {
    auto fd = common::CreateSealedMemfd("mapping-cache-test", size);
    EXPECT_TRUE(fd.ok()) << fd.status();
    memfd_ = *std::move(fd);
    auto w = common::MappedRegion::Map(memfd_.get(), size, MapMode::kSharedWritable, "w");
    EXPECT_TRUE(w.ok());
    w->data()[0] = 42;
  }
  MappingCache::FetchFn Fetch() {
    return [this]() -> absl::StatusOr<BufferFd> {
      ++fetches;
      int fd = ::fcntl(memfd_.get(), F_DUPFD_CLOEXEC, 0);
      handed_out.push_back(fd);
      return BufferFd{common::UniqueFd(fd), size_};
    };
  }
  int fetches = 0;
  std::vector<int> handed_out;

 private:
  uint64_t size_;
  common::UniqueFd memfd_;
};

bool FdIsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

TEST(MappingCacheTest, ASecondLookupOfABufferFetchesNoFdAndMapsNothingNew) {
  FakeBroker broker(8192);
  MappingCache cache;
  MappingKey key{"nonce", 1, MapMode::kPrivate};
  auto a = cache.GetOrMap(key, broker.Fetch());
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = cache.GetOrMap(key, broker.Fetch());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(broker.fetches, 1);
  EXPECT_EQ(cache.fetches(), 1u);
  EXPECT_EQ((*a)->data()[0], 42);
  // The fetched fd was closed as soon as the buffer was mapped.
  ASSERT_EQ(broker.handed_out.size(), 1u);
  EXPECT_FALSE(FdIsOpen(broker.handed_out[0]));
}

TEST(MappingCacheTest, TheLastReferenceUnmapsAndTheNextLookupFetchesAgain) {
  FakeBroker broker(8192);
  MappingCache cache;
  MappingKey key{"nonce", 1, MapMode::kPrivate};
  auto a = cache.GetOrMap(key, broker.Fetch());
  ASSERT_TRUE(a.ok());
  std::shared_ptr<Mapping> first = *std::move(a);
  std::shared_ptr<Mapping> second = *cache.GetOrMap(key, broker.Fetch());
  const uint8_t* addr = first->data();
  EXPECT_EQ(cache.LiveCountForTest(), 1u);
  first.reset();
  EXPECT_TRUE(testing::IsMapped(addr));  // one reference left
  second.reset();
  EXPECT_FALSE(testing::IsMapped(addr));
  EXPECT_EQ(cache.LiveCountForTest(), 0u);
  auto again = cache.GetOrMap(key, broker.Fetch());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(broker.fetches, 2);
}

TEST(MappingCacheTest, KeysIncludeTheModeAndTheBrokerInstance) {
  FakeBroker broker(4096);
  MappingCache cache;
  auto priv = cache.GetOrMap({"n1", 1, MapMode::kPrivate}, broker.Fetch());
  auto ro = cache.GetOrMap({"n1", 1, MapMode::kSharedReadOnly}, broker.Fetch());
  auto other = cache.GetOrMap({"n2", 1, MapMode::kPrivate}, broker.Fetch());
  ASSERT_TRUE(priv.ok() && ro.ok() && other.ok());
  EXPECT_NE(priv->get(), ro->get());
  EXPECT_NE(priv->get(), other->get());
  EXPECT_EQ(broker.fetches, 3);
  EXPECT_EQ((*ro)->mode(), MapMode::kSharedReadOnly);
}

TEST(MappingCacheTest, AnFdSmallerThanTheBrokerSaysIsRefusedBeforeMapping) {
  auto fd = common::CreateSealedMemfd("small", 4096);
  ASSERT_TRUE(fd.ok());
  int raw = fd->get();
  MappingCache cache;
  auto result = cache.GetOrMap({"n", 9, MapMode::kPrivate}, [raw]() -> absl::StatusOr<BufferFd> {
    return BufferFd{common::UniqueFd(::dup(raw)), 1 << 20};
  });
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("buffer 9")));
  EXPECT_EQ(cache.LiveCountForTest(), 0u);
}

TEST(MappingCacheTest, AnUnsealedBufferIsRefused) {
  int raw = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(raw, 0);
  common::UniqueFd owner(raw);
  ASSERT_EQ(::ftruncate(raw, 4096), 0);
  MappingCache cache;
  auto result = cache.GetOrMapFd({"n", 3, MapMode::kPrivate}, raw, 4096);
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("shrink")));
}

TEST(MappingCacheTest, AFailedFetchIsReturnedAndCachesNothing) {
  MappingCache cache;
  auto result = cache.GetOrMap({"n", 3, MapMode::kPrivate}, []() -> absl::StatusOr<BufferFd> {
    return absl::NotFoundError("buffer 3 is not leased by this session");
  });
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer 3")));
  EXPECT_EQ(cache.LiveCountForTest(), 0u);
}

TEST(MappingCacheTest, TheAfterMapHookRunsOnTheFdBeforeItCloses) {
  FakeBroker broker(4096);
  MappingCache cache;
  int seen_seals = -1;
  auto result = cache.GetOrMap({"n", 1, MapMode::kSharedWritable}, broker.Fetch(),
                               [&](int fd) -> absl::Status {
                                 TENSORD_RETURN_IF_ERROR(common::SealFutureWrite(fd, "t"));
                                 auto seals = common::GetSeals(fd, "t");
                                 seen_seals = seals.ok() ? *seals : -1;
                                 return absl::OkStatus();
                               });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(seen_seals & common::kRequiredReaderSeals, common::kRequiredReaderSeals);
  (*result)->data()[1] = 7;  // the mapping made before the seal stays writable
}

}  // namespace
}  // namespace tensord::internal
