// EtcdClient with several endpoints, against real etcd clusters (tests/cluster/etcd_server.h):
// calls, a kept lease and a watch carry on through the next member when the one they use
// dies or freezes, and nothing is lost or delivered twice on the way.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd_client.h"
#include "server/cluster/etcd_lease_keeper.h"
#include "server/cluster/etcd_watch.h"
#include "tests/cluster/etcd_fixture.h"

namespace tensord::server::cluster {
namespace {

// Long enough for the members left to elect a leader when the one in use led (etcd's
// election timeout is 1 s): keep-alives wait for that, as writes do.
constexpr absl::Duration kTtl = absl::Seconds(5);

class EtcdMembersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdServer::Binary().empty()) {
      GTEST_SKIP() << "no etcd binary was found at configure time (Debian: etcd-server, which "
                      "deploy/install-deps.sh installs)";
    }
  }

  // Three members, and a client of all three with a short call deadline.
  void StartThree() {
    absl::StatusOr<std::vector<EtcdServer>> members = EtcdServer::StartMembers(3);
    ASSERT_TRUE(members.ok()) << members.status();
    members_ = *std::move(members);
    std::vector<std::string> endpoints;
    for (const EtcdServer& member : members_) endpoints.push_back(member.endpoint());
    EtcdOptions options{.endpoints = endpoints, .call_timeout = absl::Seconds(1)};
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // StartThree(), a key on a lease the keeper keeps, and a watch of tensord/m/names/ that
  // has seen its first put ("put tensord/m/names/1=before").
  void StartThreeKeptAndWatched() {
    StartThree();
    if (HasFatalFailure()) return;
    absl::StatusOr<std::unique_ptr<EtcdLeaseKeeper>> keeper =
        EtcdLeaseKeeper::Start(*client_, kTtl, [this](absl::Status) { lost_ = true; });
    ASSERT_TRUE(keeper.ok()) << keeper.status();
    keeper_ = *std::move(keeper);
    ASSERT_TRUE(client_->Put("tensord/m/node", "a", keeper_->id()).ok());
    watch_ = EtcdWatch::Start(*client_, "tensord/m/names/", 0, recorded_.Callback(), [](absl::Status) {});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the watch is "from now"
    ASSERT_TRUE(client_->Put("tensord/m/names/1", "before").ok());
    ASSERT_EQ(recorded_.Await(1).size(), 1u);
  }

  std::vector<EtcdServer> members_;
  std::unique_ptr<EtcdClient> client_;
  // Declared after the client: they go first.
  std::atomic<bool> lost_{false};
  std::unique_ptr<EtcdLeaseKeeper> keeper_;
  Recorder recorded_;
  std::unique_ptr<EtcdWatch> watch_;
};

// A first endpoint nobody listens on: every call, a write included, reaches the second.
TEST_F(EtcdMembersTest, AnEndpointThatIsDownIsPassedOver) {
  absl::StatusOr<EtcdServer> server = EtcdServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(
      {.endpoints = {"http://127.0.0.1:9", server->endpoint()}, .call_timeout = absl::Seconds(2)});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->current_endpoint(), "http://127.0.0.1:9");
  absl::StatusOr<int64_t> put = (*client)->Put("tensord/m/a", "1");
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ((*client)->current_endpoint(), server->endpoint());
  absl::StatusOr<std::optional<EtcdKeyValue>> got = (*client)->Get("tensord/m/a");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "1");

  // Both down: the error names every endpoint.
  server->Stop();
  absl::StatusOr<int64_t> failed = (*client)->Put("tensord/m/b", "2");
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(EtcdClient::NoAnswer(grpc::Status(static_cast<grpc::StatusCode>(failed.status().code()), "")))
      << failed.status();
  EXPECT_NE(failed.status().message().find(absl::StrCat("etcd at http://127.0.0.1:9,", server->endpoint())),
            std::string_view::npos)
      << failed.status();
}

// The member in use is killed: its lease stays alive past a TTL through another member,
// the watch resumes there with every change once and in order, and writes go on.
TEST_F(EtcdMembersTest, TheMemberInUseDiesAndTheNextCarriesOn) {
  StartThreeKeptAndWatched();
  if (HasFatalFailure()) return;

  const std::string first = client_->current_endpoint();
  ASSERT_EQ(first, members_[0].endpoint());
  members_[0].Stop();
  // If it led the cluster, the others elect a leader first: writes may fail meanwhile.
  absl::StatusOr<int64_t> elected = absl::UnavailableError("not tried");
  for (const absl::Time give_up = absl::Now() + absl::Seconds(10); !elected.ok() && absl::Now() < give_up;) {
    elected = client_->Put("tensord/m/names/2", "after");
  }
  ASSERT_TRUE(elected.ok()) << "no write got through the two members left within 10 s: " << elected.status();
  for (int i = 3; i <= 5; ++i) {
    absl::StatusOr<int64_t> put = client_->Put(absl::StrCat("tensord/m/names/", i), "after");
    ASSERT_TRUE(put.ok()) << "put " << i << " after the member in use died: " << put.status();
  }
  EXPECT_NE(client_->current_endpoint(), first);
  EXPECT_EQ(recorded_.Await(5),
            (std::vector<std::string>{"put tensord/m/names/1=before", "put tensord/m/names/2=after",
                                      "put tensord/m/names/3=after", "put tensord/m/names/4=after",
                                      "put tensord/m/names/5=after"}));

  const int64_t renewed = keeper_->renewals();
  std::this_thread::sleep_for(absl::ToChronoMilliseconds(kTtl + absl::Seconds(1)));
  EXPECT_FALSE(lost_.load()) << "the lease was lost although two members still answered";
  EXPECT_GE(keeper_->renewals(), renewed + 2);
  absl::StatusOr<std::optional<EtcdKeyValue>> node = client_->Get("tensord/m/node");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_TRUE(node->has_value()) << "the key went with a lease kept through the other members";
  EXPECT_EQ(recorded_.Lines().size(), 5u) << "a change delivered twice after the watch moved";
}

// The member in use freezes (it takes connections and answers nothing, as one cut off
// does): the keeper passes it over within the TTL, a call after one that timed out goes to
// the next member, and the watch, stalled on the frozen member, is found out by gRPC's
// pings (10 s, then 5 s for the answer) and resumes on the next with nothing lost.
TEST_F(EtcdMembersTest, AFrozenMemberIsPassedOver) {
  StartThreeKeptAndWatched();
  if (HasFatalFailure()) return;

  members_[0].Pause();
  const absl::Time paused = absl::Now();
  std::this_thread::sleep_for(absl::ToChronoMilliseconds(kTtl + absl::Seconds(1)));
  EXPECT_FALSE(lost_.load()) << "the lease was lost although two members still answered";
  EXPECT_NE(client_->current_endpoint(), members_[0].endpoint());
  absl::StatusOr<std::optional<EtcdKeyValue>> node = client_->Get("tensord/m/node");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_TRUE(node->has_value()) << "the key went with a lease kept through the other members";

  ASSERT_TRUE(client_->Put("tensord/m/names/2", "while frozen").ok());
  std::vector<std::string> lines = recorded_.Await(2);
  while (lines.size() < 2 && absl::Now() - paused < absl::Seconds(25)) lines = recorded_.Await(2);
  members_[0].Resume();
  EXPECT_EQ(lines, (std::vector<std::string>{"put tensord/m/names/1=before", "put tensord/m/names/2=while frozen"}))
      << "the watch did not move on from the frozen member within 25 s";
}

}  // namespace
}  // namespace tensord::server::cluster
