#include "client/mapping_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "common/memory/host/host_importer.h"
#include "common/memory/host/memfd.h"
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

// What FETCH_FD hands out for host memory: one memfd, no handle bytes.
common::FetchedBuffer HostHandle(common::UniqueFd fd, uint64_t size) {
  common::FetchedBuffer buffer;
  buffer.size = size;
  buffer.handle.fds.push_back(std::move(fd));
  return buffer;
}

const common::Importers& HostOnly() {
  static const common::Importers* importers = [] {
    std::vector<std::unique_ptr<common::Importer>> list;
    list.push_back(std::make_unique<common::HostImporter>());
    return new common::Importers(std::move(list));
  }();
  return *importers;
}

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
    return [this]() -> absl::StatusOr<common::FetchedBuffer> {
      ++fetches;
      int fd = ::fcntl(memfd_.get(), F_DUPFD_CLOEXEC, 0);
      handed_out.push_back(fd);
      return HostHandle(common::UniqueFd(fd), size_);
    };
  }
  int fetches = 0;
  std::vector<int> handed_out;
  int memfd() const { return memfd_.get(); }

 private:
  uint64_t size_;
  common::UniqueFd memfd_;
};

bool FdIsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

TEST(MappingCacheTest, ASecondLookupOfABufferFetchesNoFdAndMapsNothingNew) {
  FakeBroker broker(8192);
  MappingCache cache(HostOnly());
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

// The first writable mapping of a producer's arena seals it against writable mappings:
// threads that miss at the same time must share that one, not fail to map their own.
TEST(MappingCacheTest, ConcurrentFirstWritableMappingsOfAnArenaShareOne) {
  auto memfd = common::CreateSealedMemfd("mapping-cache-race", 1 << 16);
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  MappingCache cache(HostOnly());
  const MappingKey key{"nonce", 7, MapMode::kSharedWritable};
  auto fetch = [&]() -> absl::StatusOr<common::FetchedBuffer> {
    return HostHandle(common::UniqueFd(::fcntl(memfd->get(), F_DUPFD_CLOEXEC, 0)), 1 << 16);
  };
  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<std::shared_ptr<Mapping>>> results(kThreads, absl::UnknownError("unset"));
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      results[t] = cache.GetOrMap(key, fetch, Retention::kSession);
    });
  }
  go = true;
  for (std::thread& thread : threads) thread.join();
  for (const auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->get(), results[0]->get());
  }
  (*results[0])->data()[0] = 1;  // writable
}

TEST(MappingCacheTest, TheLastReferenceUnmapsAndTheNextLookupFetchesAgain) {
  FakeBroker broker(8192);
  MappingCache cache(HostOnly());
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
  MappingCache cache(HostOnly());
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
  MappingCache cache(HostOnly());
  auto result = cache.GetOrMap({"n", 9, MapMode::kPrivate}, [raw]() -> absl::StatusOr<common::FetchedBuffer> {
    return HostHandle(common::UniqueFd(::dup(raw)), 1 << 20);
  });
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("buffer 9")));
  EXPECT_EQ(cache.LiveCountForTest(), 0u);
}

TEST(MappingCacheTest, AnUnsealedBufferIsRefused) {
  int raw = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(raw, 0);
  common::UniqueFd owner(raw);
  ASSERT_EQ(::ftruncate(raw, 4096), 0);
  MappingCache cache(HostOnly());
  auto result = cache.GetOrMapHandle({"n", 3, MapMode::kPrivate}, HostHandle(common::UniqueFd(::dup(raw)), 4096));
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("shrink")));
}

TEST(MappingCacheTest, AFailedFetchIsReturnedAndCachesNothing) {
  MappingCache cache(HostOnly());
  auto result = cache.GetOrMap({"n", 3, MapMode::kPrivate}, []() -> absl::StatusOr<common::FetchedBuffer> {
    return absl::NotFoundError("buffer 3 is not leased by this session");
  });
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer 3")));
  EXPECT_EQ(cache.LiveCountForTest(), 0u);
}

TEST(MappingCacheTest, TheProducersWritableMappingSealsTheBufferForReaders) {
  FakeBroker broker(4096);
  MappingCache cache(HostOnly());
  auto result = cache.GetOrMap({"n", 1, MapMode::kSharedWritable}, broker.Fetch());
  ASSERT_TRUE(result.ok()) << result.status();
  auto seals = common::GetSeals(broker.memfd(), "t");
  ASSERT_TRUE(seals.ok());
  EXPECT_EQ(*seals & common::kRequiredReaderSeals, common::kRequiredReaderSeals);
  (*result)->data()[1] = 7;  // the mapping made before the seal stays writable
}

// An importer for another device type that counts its regions: the cache keys, keeps and
// drops them as it does host mappings.
class CountingImporter final : public common::Importer {
 public:
  class Region final : public common::ImportedRegion {
   public:
    Region(CountingImporter* owner, uint64_t size, MapMode mode) : owner_(owner), bytes_(size), mode_(mode) {
      ++owner_->live;
    }
    ~Region() override { --owner_->live; }
    uint8_t* data() const override { return const_cast<uint8_t*>(bytes_.data()); }
    uint64_t size() const override { return bytes_.size(); }
    MapMode mode() const override { return mode_; }

   private:
    CountingImporter* owner_;
    std::vector<uint8_t> bytes_;
    MapMode mode_;
  };
  tensord::v1::DeviceType device_type() const override { return tensord::v1::DEVICE_TYPE_CUDA; }
  absl::StatusOr<std::unique_ptr<common::ImportedRegion>> Import(const common::FetchedBuffer& buffer, MapMode mode,
                                                                 const std::string& what) override {
    ++imports;
    last_handle = buffer.handle.data;
    if (buffer.handle.data.empty()) return absl::DataLossError(what + ": no handle bytes");
    return std::make_unique<Region>(this, buffer.size, mode);
  }
  std::atomic<int> imports{0};
  std::atomic<int> live{0};
  std::string last_handle;
};

TEST(MappingCacheTest, EveryDeviceTypeGoesThroughItsImporterWithTheSameKeysAndRetention) {
  auto counting = std::make_unique<CountingImporter>();
  CountingImporter* device = counting.get();
  std::vector<std::unique_ptr<common::Importer>> list;
  list.push_back(std::make_unique<common::HostImporter>());
  list.push_back(std::move(counting));
  common::Importers importers(std::move(list));
  MappingCache cache(importers);
  auto fetch = [] {
    common::FetchedBuffer buffer;
    buffer.buffer_id = 4;
    buffer.size = 2 << 20;
    buffer.device_type = tensord::v1::DEVICE_TYPE_CUDA;
    buffer.handle.data = "device handle";
    return absl::StatusOr<common::FetchedBuffer>(std::move(buffer));
  };
  const MappingKey key{"n", 4, MapMode::kPrivate};
  auto a = cache.GetOrMap(key, fetch);
  auto b = cache.GetOrMap(key, fetch);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(device->imports, 1);
  EXPECT_EQ(device->last_handle, "device handle");
  EXPECT_EQ((*a)->size(), uint64_t{2} << 20);
  EXPECT_EQ(device->live, 1);
  a->reset();
  b->reset();
  EXPECT_EQ(device->live, 0);  // the last reference undid the import

  // An arena-like retention keeps it past its last user, as for host memory.
  auto kept = cache.GetOrMap({"n", 5, MapMode::kSharedWritable}, fetch, Retention::kSession);
  ASSERT_TRUE(kept.ok());
  kept->reset();
  EXPECT_EQ(device->live, 1);
  cache.ReleaseKept();
  EXPECT_EQ(device->live, 0);

  // A device type no importer serves fails with a reason and maps nothing.
  auto level_zero = [] {
    common::FetchedBuffer buffer;
    buffer.size = 4096;
    buffer.device_type = tensord::v1::DEVICE_TYPE_ONEAPI;
    return absl::StatusOr<common::FetchedBuffer>(std::move(buffer));
  };
  EXPECT_THAT(cache.GetOrMap({"n", 6, MapMode::kPrivate}, level_zero),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("DEVICE_TYPE_ONEAPI")));
}

// The CUDA_HOST importer's shape without a driver: the host import, wrapped in a region
// that names its own view type and counts itself.
class PinningImporter final : public common::Importer {
 public:
  class Region final : public common::ImportedRegion {
   public:
    Region(PinningImporter* owner, std::unique_ptr<common::ImportedRegion> host)
        : owner_(owner), host_(std::move(host)) {
      ++owner_->live;
    }
    ~Region() override { --owner_->live; }
    uint8_t* data() const override { return host_->data(); }
    uint64_t size() const override { return host_->size(); }
    MapMode mode() const override { return host_->mode(); }
    tensord::v1::DeviceType view_device_type() const override { return tensord::v1::DEVICE_TYPE_CUDA_HOST; }

   private:
    PinningImporter* owner_;
    std::unique_ptr<common::ImportedRegion> host_;
  };
  tensord::v1::DeviceType device_type() const override { return tensord::v1::DEVICE_TYPE_CUDA_HOST; }
  absl::StatusOr<std::unique_ptr<common::ImportedRegion>> Import(const common::FetchedBuffer& buffer, MapMode mode,
                                                                 const std::string& what) override {
    ++imports;
    TENSORD_ASSIGN_OR_RETURN(std::unique_ptr<common::ImportedRegion> host, host_.Import(buffer, mode, what));
    return std::make_unique<Region>(this, std::move(host));
  }
  std::atomic<int> imports{0};
  std::atomic<int> live{0};

 private:
  common::HostImporter host_;
};

TEST(MappingCacheTest, APinnedAndAnUnpinnedViewOfOneBufferAreDifferentRegions) {
  auto pinning = std::make_unique<PinningImporter>();
  PinningImporter* pinned_importer = pinning.get();
  std::vector<std::unique_ptr<common::Importer>> list;
  list.push_back(std::make_unique<common::HostImporter>());
  list.push_back(std::move(pinning));
  common::Importers importers(std::move(list));
  MappingCache cache(importers);
  FakeBroker broker(8192);

  const MappingKey plain_key{"n", 1, MapMode::kSharedReadOnly};
  const MappingKey pinned_key{"n", 1, MapMode::kSharedReadOnly, tensord::v1::DEVICE_TYPE_CUDA_HOST};
  auto plain = cache.GetOrMap(plain_key, broker.Fetch());
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto pinned = cache.GetOrMap(pinned_key, broker.Fetch());
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  // Same buffer, same mode, but the view kind differs: its own fetch, importer and mapping.
  EXPECT_NE(plain->get(), pinned->get());
  EXPECT_NE((*plain)->data(), (*pinned)->data());
  EXPECT_EQ(broker.fetches, 2);
  EXPECT_EQ(pinned_importer->imports, 1);
  EXPECT_EQ((*plain)->view_device_type(), tensord::v1::DEVICE_TYPE_UNSPECIFIED);
  EXPECT_EQ((*pinned)->view_device_type(), tensord::v1::DEVICE_TYPE_CUDA_HOST);
  EXPECT_EQ((*pinned)->data()[0], 42);  // the same memory underneath
  EXPECT_EQ(cache.LiveCountForTest(), 2u);

  // A second pinned view of the buffer (another tensor of an arena) reuses the region:
  // one import, so one registration, per buffer.
  auto again = cache.GetOrMap(pinned_key, broker.Fetch());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), pinned->get());
  EXPECT_EQ(pinned_importer->imports, 1);
  EXPECT_EQ(broker.fetches, 2);

  // Batches route by the view kind too.
  const BufferToMap batch[] = {{plain_key, Retention::kNone}, {pinned_key, Retention::kNone}};
  auto many = cache.GetOrMapMany(batch, [](std::span<const uint64_t>)
                                            -> absl::StatusOr<std::vector<common::FetchedBuffer>> {
    return absl::InternalError("everything is mapped already");
  });
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ((*many)[0].get(), plain->get());
  EXPECT_EQ((*many)[1].get(), pinned->get());

  pinned->reset();
  again->reset();
  (*many)[1].reset();
  EXPECT_EQ(pinned_importer->live, 0);  // the pinned region went with its last user
  EXPECT_EQ(cache.LiveCountForTest(), 1u);
}

// Several sealed memfds, by buffer id, behind a FetchManyFn that records each call.
class FakeBrokerMany {
 public:
  void Add(uint64_t id, uint64_t size) { buffers_.emplace(id, std::make_unique<FakeBroker>(size)); }
  MappingCache::FetchManyFn Fetch() {
    return [this](std::span<const uint64_t> ids) -> absl::StatusOr<std::vector<common::FetchedBuffer>> {
      calls.emplace_back(ids.begin(), ids.end());
      std::vector<common::FetchedBuffer> out;
      for (uint64_t id : ids) {
        auto it = buffers_.find(id);
        if (it == buffers_.end()) return absl::NotFoundError("buffer " + std::to_string(id) + " is not held");
        absl::StatusOr<common::FetchedBuffer> fd = it->second->Fetch()();
        if (!fd.ok()) return fd.status();
        out.push_back(*std::move(fd));
      }
      return out;
    };
  }
  std::vector<std::vector<uint64_t>> calls;

 private:
  std::map<uint64_t, std::unique_ptr<FakeBroker>> buffers_;
};

TEST(MappingCacheTest, GetOrMapManyFetchesOnlyTheMissingBuffersInOneCall) {
  FakeBrokerMany broker;
  for (uint64_t id : {1, 2, 3}) broker.Add(id, 4096);
  MappingCache cache(HostOnly());
  auto held = cache.GetOrMap({"n", 2, MapMode::kPrivate}, [&]() -> absl::StatusOr<common::FetchedBuffer> {
    auto fds = broker.Fetch()(std::vector<uint64_t>{2});
    if (!fds.ok()) return fds.status();
    return std::move((*fds)[0]);
  });
  ASSERT_TRUE(held.ok()) << held.status();
  broker.calls.clear();
  const uint64_t fetches_before = cache.fetches();
  const uint64_t calls_before = cache.fetch_calls();

  std::vector<BufferToMap> wanted = {{{"n", 3, MapMode::kPrivate}},
                                     {{"n", 2, MapMode::kPrivate}},
                                     {{"n", 1, MapMode::kPrivate}},
                                     {{"n", 3, MapMode::kPrivate}}};
  auto mapped = cache.GetOrMapMany(wanted, broker.Fetch());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_EQ(mapped->size(), 4u);
  // One fetch, for the buffers not mapped yet, each once, in the order first asked for.
  ASSERT_EQ(broker.calls.size(), 1u);
  EXPECT_EQ(broker.calls[0], (std::vector<uint64_t>{3, 1}));
  EXPECT_EQ(cache.fetches(), fetches_before + 2);
  EXPECT_EQ(cache.fetch_calls(), calls_before + 1);
  EXPECT_EQ((*mapped)[1].get(), held->get());
  EXPECT_EQ((*mapped)[0].get(), (*mapped)[3].get());
  EXPECT_NE((*mapped)[0].get(), (*mapped)[2].get());
  EXPECT_EQ((*mapped)[2]->data()[0], 42);

  // All mapped now: a second batch fetches nothing.
  auto again = cache.GetOrMapMany(wanted, broker.Fetch());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(broker.calls.size(), 1u);
  EXPECT_EQ((*again)[2].get(), (*mapped)[2].get());
}

TEST(MappingCacheTest, GetOrMapManyReportsAFailedFetchAndCachesNothing) {
  FakeBrokerMany broker;
  broker.Add(1, 4096);
  MappingCache cache(HostOnly());
  std::vector<BufferToMap> wanted = {{{"n", 1, MapMode::kPrivate}}, {{"n", 7, MapMode::kPrivate}}};
  auto mapped = cache.GetOrMapMany(wanted, broker.Fetch());
  EXPECT_THAT(mapped, StatusIs(absl::StatusCode::kNotFound, HasSubstr("buffer 7")));
  EXPECT_EQ(cache.LiveCountForTest(), 0u);

  // A fetch that answers with the wrong number of fds is refused.
  auto short_fetch = [](std::span<const uint64_t>) -> absl::StatusOr<std::vector<common::FetchedBuffer>> {
    return std::vector<common::FetchedBuffer>{};
  };
  EXPECT_THAT(cache.GetOrMapMany(wanted, short_fetch),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("asked for 2 buffers, got 0")));
}

TEST(MappingCacheTest, GetOrMapManyKeepsTheGoodMappingsWhenOneBufferIsBad) {
  FakeBrokerMany broker;
  broker.Add(1, 4096);
  broker.Add(2, 4096);
  MappingCache cache(HostOnly());
  // Buffer 2's fd is smaller than the broker claims.
  auto lying = [&](std::span<const uint64_t> ids) -> absl::StatusOr<std::vector<common::FetchedBuffer>> {
    TENSORD_ASSIGN_OR_RETURN(std::vector<common::FetchedBuffer> fds, broker.Fetch()(ids));
    fds[1].size = 1 << 20;
    return fds;
  };
  std::vector<BufferToMap> wanted = {{{"n", 1, MapMode::kSharedWritable}, Retention::kSession},
                                     {{"n", 2, MapMode::kSharedWritable}, Retention::kSession}};
  auto mapped = cache.GetOrMapMany(wanted, lying);
  EXPECT_THAT(mapped, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("buffer 2")));
  // Buffer 1 was mapped (and sealed): a producer could never map it writable again, so it
  // stays.
  EXPECT_EQ(cache.KeptCountForTest(), 1u);
  auto one = cache.GetOrMapMany(std::span(wanted).first(1), broker.Fetch());
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(broker.calls.size() == 1u) << "buffer 1 was fetched again";
}

TEST(MappingCacheTest, ASessionMappingOutlivesItsLastUserUntilReleaseKept) {
  FakeBroker broker(8192);
  MappingCache cache(HostOnly(), std::chrono::milliseconds(0));
  MappingKey key{"n", 5, MapMode::kSharedWritable};
  auto first = cache.GetOrMap(key, broker.Fetch(), Retention::kSession);
  ASSERT_TRUE(first.ok());
  const uint8_t* addr = (*first)->data();
  first = absl::CancelledError("dropped");
  EXPECT_TRUE(testing::IsMapped(addr));
  // Sweeps leave it alone however late.
  cache.Sweep(MappingCache::Clock::now() + std::chrono::hours(24));
  EXPECT_TRUE(testing::IsMapped(addr));
  auto second = cache.GetOrMap(key, broker.Fetch(), Retention::kSession);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)->data(), addr);
  EXPECT_EQ(broker.fetches, 1);
  second = absl::CancelledError("dropped");
  cache.ReleaseKept();
  EXPECT_FALSE(testing::IsMapped(addr));
  EXPECT_EQ(cache.LiveCountForTest(), 0u);
}

TEST(MappingCacheTest, ALingerMappingGoesOnceUnusedForTheLinger) {
  using Clock = MappingCache::Clock;
  using std::chrono::milliseconds;
  FakeBroker broker(8192);
  MappingCache cache(HostOnly(), milliseconds(50));
  MappingKey key{"n", 6, MapMode::kPrivate};
  auto mapping = cache.GetOrMap(key, broker.Fetch(), Retention::kLinger);
  ASSERT_TRUE(mapping.ok());
  const uint8_t* addr = (*mapping)->data();
  const Clock::time_point t0 = Clock::now();
  // In use: never dropped, nothing to wake up for.
  EXPECT_EQ(cache.Sweep(t0 + std::chrono::hours(1)), Clock::time_point::max());
  EXPECT_TRUE(testing::IsMapped(addr));

  mapping = absl::CancelledError("dropped");
  EXPECT_EQ(cache.Sweep(t0), t0 + milliseconds(50));  // unused from here on
  EXPECT_EQ(cache.Sweep(t0 + milliseconds(49)), t0 + milliseconds(50));
  EXPECT_TRUE(testing::IsMapped(addr));
  // Used again within the linger: its linger starts over at the next sweep.
  ASSERT_TRUE(cache.GetOrMap(key, broker.Fetch(), Retention::kLinger).ok());
  EXPECT_EQ(broker.fetches, 1);
  EXPECT_EQ(cache.Sweep(t0 + milliseconds(60)), t0 + milliseconds(110));
  EXPECT_TRUE(testing::IsMapped(addr));
  EXPECT_EQ(cache.Sweep(t0 + milliseconds(110)), Clock::time_point::max());
  EXPECT_FALSE(testing::IsMapped(addr));
  EXPECT_EQ(cache.KeptCountForTest(), 0u);
  ASSERT_TRUE(cache.GetOrMap(key, broker.Fetch(), Retention::kLinger).ok());
  EXPECT_EQ(broker.fetches, 2);
}

// The broker freed a recycled buffer: what the cache kept of it goes at once (every mode
// and view of that buffer, nothing of another), whatever its linger; a view still using it
// keeps it mapped until the view goes.
TEST(MappingCacheTest, DropKeptLetsGoOfOneBufferAtOnce) {
  FakeBroker broker(8192);
  FakeBroker other(8192);
  MappingCache cache(HostOnly(), std::chrono::hours(1));
  MappingKey key{"n", 6, MapMode::kPrivate};
  MappingKey readonly{"n", 6, MapMode::kSharedReadOnly};
  MappingKey neighbour{"n", 7, MapMode::kPrivate};
  auto in_use = cache.GetOrMap(key, broker.Fetch(), Retention::kLinger);
  ASSERT_TRUE(in_use.ok());
  const uint8_t* in_use_addr = (*in_use)->data();
  auto idle = cache.GetOrMap(readonly, broker.Fetch(), Retention::kLinger);
  ASSERT_TRUE(idle.ok());
  const uint8_t* idle_addr = (*idle)->data();
  idle = absl::CancelledError("dropped");
  ASSERT_TRUE(cache.GetOrMap(neighbour, other.Fetch(), Retention::kLinger).ok());
  ASSERT_EQ(cache.KeptCountForTest(), 3u);

  EXPECT_EQ(cache.DropKept(6), 2u);
  EXPECT_EQ(cache.KeptCountForTest(), 1u);  // buffer 7's
  EXPECT_FALSE(testing::IsMapped(idle_addr));
  EXPECT_TRUE(testing::IsMapped(in_use_addr));  // its view still uses it
  in_use = absl::CancelledError("dropped");
  EXPECT_FALSE(testing::IsMapped(in_use_addr));
  EXPECT_EQ(cache.DropKept(6), 0u);
}

TEST(MappingCacheTest, SweepsLeaveDedicatedBuffersToTheirViews) {
  FakeBroker broker(4096);
  MappingCache cache(HostOnly(), std::chrono::milliseconds(0));
  auto mapping = cache.GetOrMap({"n", 8, MapMode::kPrivate}, broker.Fetch());
  ASSERT_TRUE(mapping.ok());
  const uint8_t* addr = (*mapping)->data();
  cache.Sweep(MappingCache::Clock::now());
  EXPECT_TRUE(testing::IsMapped(addr));  // its user still holds it
  EXPECT_EQ(cache.KeptCountForTest(), 0u);
  mapping = absl::CancelledError("dropped");
  EXPECT_FALSE(testing::IsMapped(addr));  // the last user unmapped it, no sweep needed
  // Its expired entry is forgotten by a sweep (at most once a second), never looked up.
  EXPECT_EQ(cache.EntryCountForTest(), 1u);
  const auto now = MappingCache::Clock::now() + std::chrono::hours(1);  // past the sweep above
  cache.Sweep(now);
  EXPECT_EQ(cache.EntryCountForTest(), 0u);
  ASSERT_TRUE(cache.GetOrMap({"n", 9, MapMode::kPrivate}, broker.Fetch()).ok());
  cache.Sweep(now + std::chrono::milliseconds(500));
  EXPECT_EQ(cache.EntryCountForTest(), 1u);
  cache.Sweep(now + std::chrono::seconds(1));
  EXPECT_EQ(cache.EntryCountForTest(), 0u);
}

// A 4-page buffer mapped twice: writable and shared (the producer), copy-on-write (a reader).
struct WriterAndReader {
  common::MappedRegion writer;
  Mapping reader;
};
WriterAndReader MapTwice(const char* name) {
  auto fd = common::CreateSealedMemfd(name, 4 * 4096);
  EXPECT_TRUE(fd.ok()) << fd.status();
  auto writer = common::MappedRegion::Map(fd->get(), 4 * 4096, MapMode::kSharedWritable, "w");
  EXPECT_TRUE(writer.ok()) << writer.status();
  auto reader = common::MappedRegion::Map(fd->get(), 4 * 4096, MapMode::kPrivate, "r");
  EXPECT_TRUE(reader.ok()) << reader.status();
  return WriterAndReader{*std::move(writer), Mapping(std::make_unique<common::HostRegion>(*std::move(reader)))};
}

TEST(MappingCacheTest, DiscardingPrivatePagesShowsTheBuffersContentsAgain) {
  auto [writer_region, mapping] = MapTwice("discard");
  common::MappedRegion* writer = &writer_region;
  // The reader writes its own copies of pages 1 and 2; then the buffer changes underneath.
  mapping.data()[4096] = 1;
  mapping.data()[2 * 4096] = 2;
  writer->data()[4096] = 10;
  writer->data()[2 * 4096] = 20;
  EXPECT_EQ(mapping.data()[4096], 1);
  // Page 1 (a 100-byte slot at its start is discarded whole); page 2 keeps its copy.
  ASSERT_TRUE(mapping.DiscardPrivatePages(4096, 100).ok());
  EXPECT_EQ(mapping.data()[4096], 10);
  EXPECT_EQ(mapping.data()[2 * 4096], 2);
  // An unaligned slot is left alone: it could share its first page with a neighbour.
  ASSERT_TRUE(mapping.DiscardPrivatePages(2 * 4096 + 8, 100).ok());
  EXPECT_EQ(mapping.data()[2 * 4096], 2);

  // A shared mapping has no private copies to discard.
  Mapping shared(std::make_unique<common::HostRegion>(std::move(writer_region)));
  ASSERT_TRUE(shared.DiscardPrivatePages(4096, 4096).ok());
  EXPECT_EQ(shared.data()[4096], 10);
}

// Whether the page at `addr` is mapped in this process (/proc/self/pagemap bit 63);
// nullopt when pagemap cannot be read here.
std::optional<bool> PagePresent(const void* addr) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  uint64_t entry = 0;
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(addr) / 4096 * sizeof(entry));
  const bool read = ::pread(fd, &entry, sizeof(entry), at) == sizeof(entry);
  ::close(fd);
  if (!read) return std::nullopt;
  return (entry >> 63) != 0;
}

TEST(MappingCacheTest, PagesOnlyReadAreNotDiscardedAndAForkedChildChecksItsOwnPages) {
  auto [writer_region, mapping] = MapTwice("discard-read");
  common::MappedRegion* writer = &writer_region;
  writer->data()[4096] = 3;
  EXPECT_EQ(static_cast<volatile uint8_t*>(mapping.data())[4096], 3);
  std::optional<bool> present = PagePresent(mapping.data() + 4096);
  if (!present.has_value()) GTEST_SKIP() << "/proc/self/pagemap is not readable here";
  ASSERT_TRUE(*present);
  // Read only: the page maps the buffer's own page, so it stays (no madvise, no refault).
  ASSERT_TRUE(mapping.DiscardPrivatePages(4096, 4096).ok());
  EXPECT_EQ(PagePresent(mapping.data() + 4096), std::optional<bool>(true));
  // Written: the private copy goes, and the buffer's contents show again.
  mapping.data()[4096] = 7;
  writer->data()[4096] = 9;
  ASSERT_TRUE(mapping.DiscardPrivatePages(4096, 4096).ok());
  EXPECT_EQ(mapping.data()[4096], 9);

  // A forked child must look at its own pages, not at its parent's (which never wrote
  // page 2): it writes page 2, and the discard must bring the buffer's byte back.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    mapping.data()[2 * 4096] = 5;
    writer->data()[2 * 4096] = 6;
    const bool discarded = mapping.DiscardPrivatePages(2 * 4096, 4096).ok();
    ::_exit(discarded && mapping.data()[2 * 4096] == 6 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child's private copy of page 2 was not discarded";
}

}  // namespace
}  // namespace tensord::internal
