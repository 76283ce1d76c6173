// EtcdWatch against a real etcd: the changes under a prefix arrive in order, exactly once,
// across an etcd restart; an expired lease's keys arrive as deletes; a compacted start is
// reported, not papered over.
#include "server/cluster/etcd_watch.h"

#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/cluster/etcd_fixture.h"

namespace tensord::server::cluster {
namespace {

TEST_F(EtcdTest, WatchDeliversChangesInOrderExactlyOnceAcrossARestart) {
  Recorder recorded;
  absl::Notification failed;
  auto watch = EtcdWatch::Start(*client_, "tensord/names/", 0, recorded.Callback(),
                                [&](absl::Status) { failed.Notify(); });
  // The watch is "from now": let it be created before the first change.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(client_->Put("tensord/names/a", "1").ok());
  ASSERT_TRUE(client_->Put("tensord/other", "not watched").ok());
  ASSERT_TRUE(client_->Put("tensord/names/b", "2").ok());
  ASSERT_TRUE(client_->Delete("tensord/names/a").ok());
  EXPECT_EQ(recorded.Await(3), (std::vector<std::string>{"put tensord/names/a=1", "put tensord/names/b=2",
                                                           "delete tensord/names/a"}));

  // etcd killed and started again (same data): the stream breaks and resumes after the last
  // revision delivered.
  ASSERT_TRUE(server_->Restart().ok());
  ASSERT_TRUE(client_->Put("tensord/names/c", "3").ok());
  EXPECT_EQ(recorded.Await(4), (std::vector<std::string>{"put tensord/names/a=1", "put tensord/names/b=2",
                                                           "delete tensord/names/a", "put tensord/names/c=3"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // time for a duplicate to show
  EXPECT_EQ(recorded.Lines().size(), 4u);
  EXPECT_GE(watch->resumptions(), 1);
  EXPECT_FALSE(failed.HasBeenNotified());
}

TEST_F(EtcdTest, WatchFromARevisionReplaysWhatCameAfterIt) {
  absl::StatusOr<int64_t> first = client_->Put("tensord/names/x", "1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(client_->Put("tensord/names/x", "2").ok());
  Recorder recorded;
  auto watch = EtcdWatch::Start(*client_, "tensord/names/", *first + 1, recorded.Callback(), [](absl::Status) {});
  EXPECT_EQ(recorded.Await(1), (std::vector<std::string>{"put tensord/names/x=2"}));
}

// A node that dies stops keeping its lease: its names reach every watcher as deletes.
TEST_F(EtcdTest, AnExpiredLeaseArrivesAsDeletes) {
  absl::StatusOr<EtcdLeaseGrant> lease = client_->GrantLease(absl::Seconds(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put("tensord/names/dead-node/t", "v", lease->id).ok());
  absl::StatusOr<std::optional<EtcdKeyValue>> put = client_->Get("tensord/names/dead-node/t");
  ASSERT_TRUE(put.ok() && put->has_value());
  Recorder recorded;
  auto watch = EtcdWatch::Start(*client_, "tensord/names/", (*put)->mod_revision + 1, recorded.Callback(),
                                [](absl::Status) {});
  EXPECT_EQ(recorded.Await(1), (std::vector<std::string>{"delete tensord/names/dead-node/t"}));
}

TEST_F(EtcdTest, AWatchFromACompactedRevisionFails) {
  absl::StatusOr<int64_t> first = client_->Put("tensord/names/k", "1");
  ASSERT_TRUE(first.ok());
  absl::StatusOr<int64_t> last = client_->Put("tensord/names/k", "2");
  ASSERT_TRUE(last.ok());
  ASSERT_TRUE(client_->Compact(*last).ok());
  absl::Notification failed;
  absl::Status why;
  Recorder recorded;
  auto watch = EtcdWatch::Start(*client_, "tensord/names/", *first, recorded.Callback(), [&](absl::Status status) {
    why = status;
    failed.Notify();
  });
  ASSERT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(why.code(), absl::StatusCode::kOutOfRange) << why;
  EXPECT_NE(why.message().find("compacted"), std::string_view::npos) << why;
}

}  // namespace
}  // namespace tensord::server::cluster
