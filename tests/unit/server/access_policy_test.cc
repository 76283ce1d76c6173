#include "server/access/access_policy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensord::server {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kDaemonUid = 1000;

AccessPolicy Policy() {
  std::map<std::string, NamespaceAcl> acls;
  acls["team"].read_uids = {2001};
  acls["team"].write_gids = {3000};
  return AccessPolicy(std::move(acls), kDaemonUid);
}

common::PeerCredentials Creds(uid_t uid, gid_t gid = 9999) { return {uid, gid, 1}; }

TEST(AccessPolicyTest, AclGrantsReadAndWriteSeparately) {
  AccessPolicy policy = Policy();
  EXPECT_TRUE(policy.CheckAccess(Creds(2001), "team", false).ok());
  absl::Status write = policy.CheckAccess(Creds(2001), "team", true);
  EXPECT_EQ(write.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(write.message(), HasSubstr("uid 2001 (gid 9999) may not write namespace"));
  // A writer may read as well.
  EXPECT_TRUE(policy.CheckAccess(Creds(2002, 3000), "team", true).ok());
  EXPECT_TRUE(policy.MayRead(Creds(2002, 3000), "team"));
  EXPECT_FALSE(policy.MayRead(Creds(2002), "team"));
  EXPECT_EQ(policy.CheckAccess(Creds(2001), "other", false).code(), absl::StatusCode::kPermissionDenied);
}

TEST(AccessPolicyTest, RootAndTheDaemonUidMayDoAnything) {
  AccessPolicy policy = Policy();
  for (uid_t uid : {uid_t{0}, kDaemonUid}) {
    EXPECT_TRUE(policy.CheckAccess(Creds(uid), "nobody-named-this", true).ok());
    EXPECT_TRUE(policy.MayRead(Creds(uid), ""));
  }
}

TEST(AccessPolicyTest, AnUnpublishedTensorIsItsProducersOnly) {
  AccessPolicy policy = Policy();
  EXPECT_TRUE(policy.MayReadIn(Creds(2005), "", 2005));
  EXPECT_FALSE(policy.MayReadIn(Creds(2001), "", 2005));
  EXPECT_FALSE(policy.MayReadIn(Creds(2005), "team", 2005));
  EXPECT_TRUE(policy.MayReadIn(Creds(2001), "team", 2005));
}

TEST(AccessPolicyTest, HostBytesInAnAclNamespaceAreNotTheProducers) {
  AccessPolicy policy = Policy();
  EXPECT_EQ(policy.UidHostBytes("team", 4096), 0u);
  EXPECT_EQ(policy.UidHostBytes("other", 4096), 4096u);
  EXPECT_EQ(policy.UidHostBytes("", 4096), 4096u);
}

}  // namespace
}  // namespace tensord::server
