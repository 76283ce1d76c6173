#include "server/state/watcher_set.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensord::server {
namespace {

namespace v1 = tensord::v1;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

class NullSink final : public WatchSink {
 public:
  bool Push(const v1::WatchEvent&) override { return true; }
  void Close() override {}
};

constexpr uid_t kDaemonUid = 1000;
constexpr uid_t kReader = 2001;
constexpr uid_t kStranger = 2002;

class WatcherSetTest : public ::testing::Test {
 protected:
  WatcherSetTest() : access_(Acls(), kDaemonUid) {}

  static std::map<std::string, NamespaceAcl> Acls() {
    std::map<std::string, NamespaceAcl> acls;
    acls["team"].read_uids = {kReader};
    acls["open"].read_uids = {kReader, kStranger};
    return acls;
  }

  std::shared_ptr<WatchSink> Add(uint64_t session, const std::string& prefix, uid_t uid) {
    auto sink = std::make_shared<NullSink>();
    set_.Add(Watcher{session, prefix, common::PeerCredentials{uid, 100, 1}, sink, 0});
    return sink;
  }

  std::vector<std::shared_ptr<WatchSink>> SinksFor(const std::string& name) const {
    v1::WatchEvent event;
    event.set_kind(v1::WatchEvent::KIND_BOUND);
    event.set_name(name);
    return set_.SinksFor(event, access_);
  }

  AccessPolicy access_;
  WatcherSet set_;
};

TEST_F(WatcherSetTest, AnEventGoesToWatchersWhosePrefixHoldsTheName) {
  auto all_team = Add(1, "team/", kReader);
  auto models = Add(1, "team/models/", kReader);
  auto exact = Add(1, "team/models/a", kReader);
  auto other = Add(1, "open/", kReader);
  EXPECT_THAT(SinksFor("team/models/a"), ElementsAre(all_team, models, exact));
  EXPECT_THAT(SinksFor("team/models/ab"), ElementsAre(all_team, models));
  EXPECT_THAT(SinksFor("team/data"), ElementsAre(all_team));
  EXPECT_THAT(SinksFor("open/x"), ElementsAre(other));
  // A prefix is whole path components: "team/mod" does not hold "team/models/a".
  Add(1, "team/mod", kReader);
  EXPECT_THAT(SinksFor("team/models/a"), ElementsAre(all_team, models, exact));
  EXPECT_THAT(SinksFor("elsewhere/x"), IsEmpty());
}

TEST_F(WatcherSetTest, AnEventGoesOnlyToWatchersThatMayReadItsNamespace) {
  auto reader = Add(1, "", kReader);
  auto stranger = Add(2, "", kStranger);
  auto daemon = Add(3, "", kDaemonUid);
  EXPECT_THAT(SinksFor("team/a"), ElementsAre(reader, daemon));
  EXPECT_THAT(SinksFor("open/a"), ElementsAre(reader, stranger, daemon));
  // No ACL names namespace "loose": only the trusted uids hear of it.
  EXPECT_THAT(SinksFor("loose"), ElementsAre(daemon));
}

TEST_F(WatcherSetTest, AWatcherSendingItsInitialBindingsHearsOnlyOfNamesItHasSent) {
  auto sink = std::make_shared<NullSink>();
  Watcher watcher{1, "open/", common::PeerCredentials{kReader, 100, 1}, sink, 0};
  watcher.initial_pending = true;
  const uint64_t id = set_.Add(std::move(watcher));
  auto settled = Add(2, "open/", kReader);
  // Nothing sent yet: every name's initial event is still to come.
  EXPECT_THAT(SinksFor("open/a"), ElementsAre(settled));
  set_.Find(id)->initial_sent_through = "open/m";
  EXPECT_THAT(SinksFor("open/a"), ElementsAre(sink, settled));
  EXPECT_THAT(SinksFor("open/m"), ElementsAre(sink, settled));
  EXPECT_THAT(SinksFor("open/m/x"), ElementsAre(settled));
  EXPECT_THAT(SinksFor("open/z"), ElementsAre(settled));
  set_.Find(id)->initial_pending = false;  // all sent
  EXPECT_THAT(SinksFor("open/z"), ElementsAre(sink, settled));
  EXPECT_EQ(set_.Find(id + 100), nullptr);
}

TEST_F(WatcherSetTest, RemovingBySessionIdAndAll) {
  auto a = Add(1, "open/", kReader);
  auto b = Add(2, "open/", kReader);
  auto c = Add(1, "open/", kStranger);
  std::vector<Watcher> removed = set_.RemoveSession(1);
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_EQ(removed[0].sink, a);
  EXPECT_EQ(removed[1].sink, c);
  EXPECT_THAT(SinksFor("open/x"), ElementsAre(b));
  uint64_t d_id = set_.Add(Watcher{3, "open/", common::PeerCredentials{kReader, 100, 1}, nullptr, 7});
  EXPECT_EQ(set_.size(), 2u);
  std::optional<Watcher> d = set_.Remove(d_id);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->metadata_bytes, 7u);
  EXPECT_FALSE(set_.Remove(d_id).has_value());
  EXPECT_EQ(set_.RemoveAll().size(), 1u);
  EXPECT_TRUE(set_.empty());
  // Ids are not reused.
  EXPECT_GT(set_.Add(Watcher{}), d_id);
}

}  // namespace
}  // namespace tensord::server
