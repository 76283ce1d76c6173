// EtcdClient and EtcdLeaseKeeper against a real etcd (tests/cluster/etcd_server.h): the
// directory's building blocks do what the cluster relies on. Without an etcd binary every
// case skips, saying why.
#include "server/cluster/etcd_client.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd_lease_keeper.h"
#include "tests/cluster/etcd_fixture.h"

namespace tensord::server::cluster {
namespace {

TEST_F(EtcdTest, PutGetListDelete) {
  absl::StatusOr<int64_t> first = client_->Put("tensord/t/a", "1");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<int64_t> second = client_->Put("tensord/t/b", std::string("\0\xff", 2));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(*second, *first);
  ASSERT_TRUE(client_->Put("tensord/u", "outside").ok());

  absl::StatusOr<std::optional<EtcdKeyValue>> a = client_->Get("tensord/t/a");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->value, "1");
  EXPECT_EQ((*a)->mod_revision, *first);

  absl::StatusOr<EtcdRange> range = client_->GetPrefix("tensord/t/");
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[0].key, "tensord/t/a");
  EXPECT_EQ(range->kvs[1].value, std::string("\0\xff", 2));  // bytes, not text
  EXPECT_GE(range->revision, *second);

  absl::StatusOr<int64_t> deleted = client_->DeletePrefix("tensord/t/");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 2);
  absl::StatusOr<std::optional<EtcdKeyValue>> gone = client_->Get("tensord/t/a");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
  absl::StatusOr<std::optional<EtcdKeyValue>> kept = client_->Get("tensord/u");
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->has_value()) << "a prefix delete took a key outside the prefix";
}

TEST_F(EtcdTest, PutIfAbsentWritesOnce) {
  absl::StatusOr<bool> first = client_->PutIfAbsent("tensord/once", "first");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  absl::StatusOr<bool> second = client_->PutIfAbsent("tensord/once", "second");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(*second);
  EXPECT_EQ((*client_->Get("tensord/once"))->value, "first");
}

// A work item taken by several nodes at once: one of them gets it.
TEST_F(EtcdTest, DeleteIfRevisionTakesExactlyOnce) {
  ASSERT_TRUE(client_->Put("tensord/queue/item", "payload").ok());
  absl::StatusOr<std::optional<EtcdKeyValue>> item = client_->Get("tensord/queue/item");
  ASSERT_TRUE(item.ok() && item->has_value());
  const int64_t revision = (*item)->mod_revision;

  constexpr int kTakers = 8;
  std::atomic<int> taken{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> takers;
  for (int i = 0; i < kTakers; ++i) {
    takers.emplace_back([&] {
      absl::StatusOr<std::optional<EtcdKeyValue>> got = client_->DeleteIfRevision("tensord/queue/item", revision);
      if (!got.ok()) {
        ++failed;
      } else if (got->has_value()) {
        EXPECT_EQ((*got)->value, "payload");
        ++taken;
      }
    });
  }
  for (std::thread& t : takers) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(taken.load(), 1);

  // A key changed since it was read is not taken at the old revision.
  ASSERT_TRUE(client_->Put("tensord/queue/item", "v1").ok());
  absl::StatusOr<std::optional<EtcdKeyValue>> v1 = client_->Get("tensord/queue/item");
  ASSERT_TRUE(client_->Put("tensord/queue/item", "v2").ok());
  absl::StatusOr<std::optional<EtcdKeyValue>> stale = client_->DeleteIfRevision("tensord/queue/item", (*v1)->mod_revision);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_FALSE(stale->has_value());
  EXPECT_EQ((*client_->Get("tensord/queue/item"))->value, "v2");
}

// A node's keys live on its lease: kept alive, they stay past the TTL; left alone, they go
// within it; the keeper's end revokes the lease and takes them at once.
TEST_F(EtcdTest, LeaseKeeperKeepsKeysAndTheirEndRemovesThem) {
  std::atomic<bool> lost{false};
  absl::StatusOr<std::unique_ptr<EtcdLeaseKeeper>> keeper =
      EtcdLeaseKeeper::Start(*client_, absl::Seconds(2), [&](absl::Status) { lost = true; });
  ASSERT_TRUE(keeper.ok()) << keeper.status();
  EXPECT_EQ((*keeper)->ttl(), absl::Seconds(2));
  ASSERT_TRUE(client_->Put("tensord/nodes/a", "node a", (*keeper)->id()).ok());

  std::this_thread::sleep_for(std::chrono::milliseconds(4500));  // over two TTLs
  absl::StatusOr<std::optional<EtcdKeyValue>> alive = client_->Get("tensord/nodes/a");
  ASSERT_TRUE(alive.ok());
  ASSERT_TRUE(alive->has_value()) << "the key went although its lease was kept alive";
  EXPECT_EQ((*alive)->lease, (*keeper)->id());
  EXPECT_GE((*keeper)->renewals(), 3) << "keep-alives every third of the TTL";
  EXPECT_FALSE(lost.load());

  keeper->reset();  // revokes
  absl::StatusOr<std::optional<EtcdKeyValue>> after = client_->Get("tensord/nodes/a");
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->has_value()) << "the keeper's end did not revoke the lease";

  // A lease nobody keeps alive: its key goes within the TTL (plus etcd's expiry check).
  absl::StatusOr<EtcdLeaseGrant> bare = client_->GrantLease(absl::Seconds(1));
  ASSERT_TRUE(bare.ok()) << bare.status();
  ASSERT_TRUE(client_->Put("tensord/nodes/b", "node b", bare->id).ok());
  absl::StatusOr<absl::Duration> gone = AwaitGone("tensord/nodes/b", absl::Seconds(10));
  ASSERT_TRUE(gone.ok()) << "a key on an abandoned 1 s lease was still there after 10 s";
}

// etcd unreachable for longer than the TTL (frozen, as if cut off): the keeper reports the
// lease lost, naming why, and the key is gone once etcd runs again.
TEST_F(EtcdTest, LeaseLostWhenEtcdIsUnreachableForItsTtl) {
  absl::Notification lost;
  absl::Status why;
  absl::StatusOr<std::unique_ptr<EtcdLeaseKeeper>> keeper =
      EtcdLeaseKeeper::Start(*client_, absl::Seconds(2), [&](absl::Status status) {
        why = status;
        lost.Notify();
      });
  ASSERT_TRUE(keeper.ok()) << keeper.status();
  ASSERT_TRUE(client_->Put("tensord/nodes/cut", "x", (*keeper)->id()).ok());

  server_->Pause();
  const absl::Time paused = absl::Now();
  EXPECT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(8)));
  const absl::Duration noticed = absl::Now() - paused;
  server_->Resume();
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable) << why;
  EXPECT_NE(why.message().find("has expired"), std::string_view::npos) << why;
  EXPECT_LE(noticed, absl::Seconds(3)) << "lost only " << noticed << " after etcd stopped answering";

  absl::StatusOr<absl::Duration> gone = AwaitGone("tensord/nodes/cut", absl::Seconds(10));
  ASSERT_TRUE(gone.ok()) << "the key of a lost lease was still there 10 s after etcd ran again";
}

TEST_F(EtcdTest, UnreachableEtcdFailsCallsNamingIt) {
  server_.reset();  // nothing listens there now
  auto client = EtcdClient::Create({.endpoints = {"http://127.0.0.1:9"}, .call_timeout = absl::Milliseconds(500)});
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> put = (*client)->Put("tensord/x", "y");
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_FALSE(put.ok());
  EXPECT_TRUE(put.status().code() == absl::StatusCode::kUnavailable ||
              put.status().code() == absl::StatusCode::kDeadlineExceeded)
      << put.status();
  EXPECT_NE(put.status().message().find("etcd at http://127.0.0.1:9"), std::string_view::npos) << put.status();
  EXPECT_NE(put.status().message().find("put 'tensord/x'"), std::string_view::npos) << put.status();

  EXPECT_FALSE(EtcdLeaseKeeper::Start(**client, absl::Seconds(2), [](absl::Status) {}).ok());
}

TEST(EtcdOptionsTest, EndpointsAreChecked) {
  EXPECT_EQ(EtcdClient::Create({.endpoints = {}}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status bare = EtcdClient::Create({.endpoints = {"127.0.0.1:2379"}}).status();
  EXPECT_EQ(bare.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bare.message().find("127.0.0.1:2379"), std::string_view::npos) << bare;
  EXPECT_EQ(EtcdClient::Create({.endpoints = {"http://"}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({.endpoints = {"http://127.0.0.1:2379"}, .call_timeout = absl::ZeroDuration()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EtcdOptionsTest, PrefixRangeEnd) {
  EXPECT_EQ(PrefixRangeEnd("a/"), "a0");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixRangeEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
}

}  // namespace
}  // namespace tensord::server::cluster
