// The Broker against a hostile second uid, in-process: access checked when a wait is
// granted (every wait kind), id waits that could only ever be granted someone else's
// tensor, Stat answering alike for what exists and what does not, the per-uid limits of
// UidQuota (sessions, tensors, metadata and leases, waits, watchers, host bytes outside ACL'd
// namespaces), the bound on tags, and arenas that start small. The real-daemon versions,
// with real uids, are in tests/integration/hostile_uid_test.cc.
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/server/broker_fixture.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;
using namespace std::chrono_literals;

constexpr uid_t kReader = 4242;    // may read "shared" (the fixture's ACL)
constexpr uid_t kStranger = 4343;  // named by no ACL

using AcquireFuture = std::future<absl::StatusOr<v1::AcquireResponse>>;

class NullSink : public WatchSink {
 public:
  bool Push(const v1::WatchEvent&) override { return true; }
  void Close() override {}
};

class BrokerUidTest : public testing::BrokerTest {
 protected:
  AcquireFuture StartAcquire(uint64_t session, v1::AcquireRequest request) {
    auto promise = std::make_shared<std::promise<absl::StatusOr<v1::AcquireResponse>>>();
    AcquireFuture future = promise->get_future();
    broker_->Acquire(session, request, [promise](absl::StatusOr<v1::AcquireResponse> r) {
      promise->set_value(std::move(r));
    });
    return future;
  }
  AcquireFuture WaitForId(uint64_t session, uint64_t tensor_id) {
    v1::AcquireRequest request;
    request.set_tensor_id(tensor_id);
    request.set_forever(true);
    return StartAcquire(session, request);
  }
  AcquireFuture WaitForName(uint64_t session, const std::string& name) {
    v1::AcquireRequest request;
    request.set_name(name);
    request.set_forever(true);
    return StartAcquire(session, request);
  }
  AcquireFuture WaitToTake(uint64_t session, const std::string& target) {
    auto promise = std::make_shared<std::promise<absl::StatusOr<v1::AcquireResponse>>>();
    AcquireFuture future = promise->get_future();
    v1::TakeRequest request;
    request.set_name_or_prefix(target);
    request.set_forever(true);
    broker_->Take(session, request, [promise](absl::StatusOr<v1::AcquireResponse> r) {
      promise->set_value(std::move(r));
    });
    return future;
  }
  absl::StatusOr<v1::AllocateResponse> AllocateTagged(uint64_t session, const std::string& ns, int64_t count,
                                                      size_t tags, size_t value_bytes) {
    v1::AllocateRequest request = Float32Request(ns, count);
    for (size_t i = 0; i < tags; ++i) (*request.mutable_tags())[absl::StrCat("k", i)] = std::string(value_bytes, 'v');
    return Allocate(session, request);
  }
  absl::StatusOr<uint64_t> Watch(uint64_t session, const std::string& prefix) {
    v1::WatchRequest request;
    request.set_prefix(prefix);
    return broker_->AddWatcher(session, request, std::make_shared<NullSink>());
  }
  static bool Ready(const AcquireFuture& future) { return future.wait_for(0s) == std::future_status::ready; }
};

// --- access at the grant ---------------------------------------------------------------

TEST_F(BrokerUidTest, AnIdWaitForATensorNotYetAllocatedIsRefusedAtOnce) {
  uint64_t owner = Open();
  uint64_t stranger = Open(kStranger);
  uint64_t seen = PublishNew(owner, "private/a");
  // The attack: wait on the next ids, then let the owner publish in a namespace the
  // stranger may not read.
  std::vector<AcquireFuture> waits;
  for (uint64_t id = seen + 1; id <= seen + 8; ++id) waits.push_back(WaitForId(stranger, id));
  for (int i = 0; i < 4; ++i) PublishNew(owner, absl::StrCat("private/next", i));
  for (AcquireFuture& wait : waits) {
    ASSERT_TRUE(Ready(wait));
    absl::StatusOr<v1::AcquireResponse> result = wait.get();
    EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound) << result.status();
  }
  EXPECT_EQ(broker_->GetStatus().leases(), 0u);
}

TEST_F(BrokerUidTest, AnIdWaitOnSomeoneElsesTensorAnswersAsForNoTensor) {
  uint64_t owner = Open();
  uint64_t stranger = Open(kStranger);
  auto creating = Allocate(owner, "", 16);  // no namespace yet: readable by its uid only
  ASSERT_TRUE(creating.ok());
  absl::StatusOr<v1::AcquireResponse> theirs = WaitForId(stranger, creating->tensor().tensor_id()).get();
  absl::StatusOr<v1::AcquireResponse> none = WaitForId(stranger, 1'000'000).get();
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BrokerUidTest, AnIdWaitOfTheProducersOwnUidIsGrantedAtPublish) {
  uint64_t producer = Open(kStranger);
  uint64_t consumer = Open(kStranger);
  auto creating = Allocate(producer, "", 16);
  ASSERT_TRUE(creating.ok()) << creating.status();
  AcquireFuture wait = WaitForId(consumer, creating->tensor().tensor_id());
  EXPECT_FALSE(Ready(wait));
  Seal(producer, *creating);
  ASSERT_TRUE(Publish(producer, creating->tensor().tensor_id(), "").ok());
  ASSERT_TRUE(Ready(wait));
  absl::StatusOr<v1::AcquireResponse> granted = wait.get();
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(granted->tensor().tensor_id(), creating->tensor().tensor_id());
}

TEST_F(BrokerUidTest, NameAndTakeWaitsInAnUnreadableNamespaceAreRefusedAndNeverGranted) {
  uint64_t owner = Open();
  uint64_t stranger = Open(kStranger);
  uint64_t reader = Open(kReader);
  AcquireFuture by_name = WaitForName(stranger, "private/later");
  AcquireFuture take = WaitToTake(stranger, "private/later");
  AcquireFuture take_prefix = WaitToTake(stranger, "private/");
  // A reader of "shared" may wait to read there, but may not take (that writes).
  AcquireFuture reader_take = WaitToTake(reader, "shared/");
  AcquireFuture reader_wait = WaitForName(reader, "shared/later");
  for (AcquireFuture* refused : {&by_name, &take, &take_prefix, &reader_take}) {
    ASSERT_TRUE(Ready(*refused));
    EXPECT_EQ(refused->get().status().code(), absl::StatusCode::kPermissionDenied);
  }
  PublishNew(owner, "private/later");
  PublishNew(owner, "shared/later");
  ASSERT_TRUE(Ready(reader_wait));
  EXPECT_TRUE(reader_wait.get().ok());
  EXPECT_EQ(broker_->GetStatus().leases(), 1u) << "the reader's lease only";
}

// --- Stat tells nothing about what the caller may not read ------------------------------

TEST_F(BrokerUidTest, StatAnswersAlikeForAnExistingAndAMissingName) {
  uint64_t owner = Open();
  uint64_t stranger = Open(kStranger);
  uint64_t id = PublishNew(owner, "private/exists");
  v1::StatRequest exists, missing, by_id, no_id;
  exists.set_name("private/exists");
  missing.set_name("private/missing");
  by_id.set_tensor_id(id);
  no_id.set_tensor_id(id + 1000);
  absl::Status a = broker_->Stat(stranger, exists).status();
  absl::Status b = broker_->Stat(stranger, missing).status();
  EXPECT_EQ(a.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(a, b) << "the same code and message";
  absl::Status c = broker_->Stat(stranger, by_id).status();
  absl::Status d = broker_->Stat(stranger, no_id).status();
  EXPECT_EQ(c.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(d.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(c.message()).find("private"), std::string::npos) << c;
}

// --- per-uid limits -----------------------------------------------------------------------

TEST_F(BrokerUidTest, SessionsPerUidAreCappedButNotForTrustedUids) {
  Start([](BrokerOptions& options) {
    options.acls["shared"].read_uids = {kReader};
    options.uid_limits[UidResource::kSessions] = 2;
  });
  common::PeerCredentials stranger{kStranger, 100, 1};
  ASSERT_TRUE(broker_->OpenSession(stranger, "a").ok());
  auto second = broker_->OpenSession(stranger, "b");
  ASSERT_TRUE(second.ok());
  absl::Status third = broker_->OpenSession(stranger, "c").status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(third.message()).find("--max-sessions-per-uid 2"), std::string::npos) << third;
  // Other uids, the daemon's own included, are not held back by the stranger.
  EXPECT_TRUE(broker_->OpenSession({kReader, 100, 1}, "r").ok());
  for (int i = 0; i < 4; ++i) Open();
  broker_->CloseSession(second->session_id());
  EXPECT_TRUE(broker_->OpenSession(stranger, "again").ok());
}

TEST_F(BrokerUidTest, MetadataOfZeroByteTensorsCountsAgainstTheUid) {
  Start([](BrokerOptions& options) { options.uid_limits[UidResource::kMetadataBytes] = 256 << 10; });
  uint64_t stranger = Open(kStranger);
  // Zero-byte tensors need no memory, but their 16 KiB of tags stay in the daemon.
  int made = 0;
  absl::Status refused;
  for (; made < 100; ++made) {
    absl::StatusOr<v1::AllocateResponse> allocated = AllocateTagged(stranger, "", 0, 4, 4000);
    if (!allocated.ok()) {
      refused = allocated.status();
      break;
    }
  }
  EXPECT_GE(made, 10);
  EXPECT_LT(made, 16);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(refused.message()).find("--max-metadata-bytes-per-uid"), std::string::npos) << refused;
  EXPECT_EQ(broker_->GetStatus().tensors(), static_cast<uint64_t>(made)) << "nothing half-made";
  // The daemon's own uid is not limited; the stranger's charge goes with its session.
  uint64_t own = Open();
  EXPECT_TRUE(AllocateTagged(own, "", 0, 4, 4000).ok());
  broker_->CloseSession(stranger);
  uint64_t again = Open(kStranger);
  EXPECT_TRUE(AllocateTagged(again, "", 0, 4, 4000).ok());
}

TEST_F(BrokerUidTest, LeasesCountAsMetadataOfTheHoldersUid) {
  Start([](BrokerOptions& options) {
    options.acls["shared"].read_uids = {kReader};
    options.uid_limits[UidResource::kMetadataBytes] = 10 * kLeaseEntryBytes;
  });
  uint64_t owner = Open();
  PublishNew(owner, "shared/x");
  uint64_t reader = Open(kReader);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Acquire(reader, "shared/x").ok()) << i;
  absl::Status eleventh = Acquire(reader, "shared/x").status();
  EXPECT_EQ(eleventh.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(eleventh.message()).find("holding one more lease"), std::string::npos) << eleventh;
  EXPECT_EQ(broker_->GetStatus().leases(), 10u);
  broker_->CloseSession(reader);
  uint64_t again = Open(kReader);
  EXPECT_TRUE(Acquire(again, "shared/x").ok()) << "the closed session's leases were given back";
}

TEST_F(BrokerUidTest, TagsAreBoundedInAll) {
  uint64_t session = Open();
  EXPECT_TRUE(AllocateTagged(session, "", 0, 4, 4000).ok());
  absl::Status too_many_bytes = AllocateTagged(session, "", 0, 5, 4000).status();
  EXPECT_EQ(too_many_bytes.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(too_many_bytes.message()).find("at most 16384 in all"), std::string::npos) << too_many_bytes;
}

TEST_F(BrokerUidTest, TensorsPerUidAreCapped) {
  Start([](BrokerOptions& options) { options.uid_limits[UidResource::kTensors] = 3; });
  uint64_t stranger = Open(kStranger);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Allocate(stranger, "", 0).ok());
  absl::Status fourth = Allocate(stranger, "", 0).status();
  EXPECT_EQ(fourth.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(fourth.message()).find("--max-tensors-per-uid 3"), std::string::npos) << fourth;
}

TEST_F(BrokerUidTest, WaitsPerUidAreCappedAcrossSessions) {
  Start([](BrokerOptions& options) {
    options.acls["shared"].read_uids = {kReader};
    options.uid_limits[UidResource::kWaits] = 3;
  });
  uint64_t a = Open(kReader);
  uint64_t b = Open(kReader);
  std::vector<AcquireFuture> waits;
  for (int i = 0; i < 2; ++i) waits.push_back(WaitForName(a, absl::StrCat("shared/", i)));
  waits.push_back(WaitForName(b, "shared/b"));
  for (AcquireFuture& wait : waits) EXPECT_FALSE(Ready(wait));
  AcquireFuture fourth = WaitForName(b, "shared/c");
  ASSERT_TRUE(Ready(fourth));
  absl::Status refused = fourth.get().status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(refused.message()).find("--max-waits-per-uid 3"), std::string::npos) << refused;
  // Closing a session gives its waits back.
  broker_->CloseSession(a);
  AcquireFuture later = WaitForName(b, "shared/d");
  EXPECT_FALSE(Ready(later));
  broker_->CloseSession(b);
}

TEST_F(BrokerUidTest, WatchersPerUidAreCapped) {
  Start([](BrokerOptions& options) { options.uid_limits[UidResource::kWatchers] = 2; });
  uint64_t stranger = Open(kStranger);
  absl::StatusOr<uint64_t> first = Watch(stranger, "");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(Watch(stranger, "").ok());
  absl::Status third = Watch(stranger, "").status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(third.message()).find("--max-watchers-per-uid 2"), std::string::npos) << third;
  EXPECT_TRUE(Watch(Open(), "").ok()) << "another uid is not held back";
  broker_->RemoveWatcher(*first);
  EXPECT_TRUE(Watch(stranger, "").ok());
}

TEST_F(BrokerUidTest, HostBytesOutsideAclNamespacesAreCappedPerUid) {
  Start([](BrokerOptions& options) {
    options.acls["team"].write_uids = {kStranger};
    options.uid_limits[UidResource::kHostBytes] = 1 << 20;
  });
  uint64_t stranger = Open(kStranger);
  // 1 MiB without a namespace, then nothing more there; a namespace whose ACL grants
  // writing is the operator's to bound.
  ASSERT_TRUE(Allocate(stranger, "", 256 << 10).ok());
  absl::Status over = Allocate(stranger, "", 1).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(over.message()).find("--max-host-bytes-per-uid 1048576"), std::string::npos) << over;
  EXPECT_TRUE(Allocate(stranger, "team", 128 << 10).ok());
  EXPECT_EQ(broker_->GetStatus().host_bytes_in_use(), uint64_t{(1 << 20) + (512 << 10)})
      << "1 MiB outside any namespace, 512 KiB in team";
}

// --- arenas start small ------------------------------------------------------------------

TEST_F(BrokerUidTest, ArenasStartSmallAndDouble) {
  Start([](BrokerOptions& options) {
    options.arena_bytes = 4 << 20;
    options.arena_max_tensor_bytes = 1 << 20;
  });
  uint64_t session = Open();
  ASSERT_TRUE(Allocate(session, "shared", 16).ok());
  EXPECT_EQ(broker_->GetStatus().host_bytes_in_use(), uint64_t{256} << 10) << "a first arena of 256 KiB";
  // Fill it (64 slots of a page), then the next arena is twice as large.
  for (int i = 0; i < 63; ++i) ASSERT_TRUE(Allocate(session, "shared", 16).ok());
  EXPECT_EQ(broker_->GetStatus().host_bytes_in_use(), uint64_t{256} << 10);
  ASSERT_TRUE(Allocate(session, "shared", 16).ok());
  EXPECT_EQ(broker_->GetStatus().host_bytes_in_use(), (uint64_t{256} + 512) << 10);
  // A tensor larger than the next doubling gets an arena its size, up to --arena-bytes.
  ASSERT_TRUE(Allocate(session, "shared", (1 << 20) / 4).ok());
  EXPECT_EQ(broker_->GetStatus().host_bytes_in_use(), (uint64_t{256} + 512 + 1024) << 10);
  EXPECT_EQ(broker_->GetStatus().buffers(), 3u);
}

}  // namespace
}  // namespace tensord::server
