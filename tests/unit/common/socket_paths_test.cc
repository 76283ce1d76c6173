#include "common/socket_paths.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::common {
namespace {

// Sets or unsets one environment variable for a scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string TmpUserPath() { return "/tmp/tensord-" + std::to_string(geteuid()) + "/tensord.sock"; }

TEST(SocketPathsTest, ExplicitSocketWins) {
  ScopedEnv tensord_socket("TENSORD_SOCKET", "/srv/t.sock");
  ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/1000");
  EXPECT_EQ(DefaultDaemonSocketPath(), "/srv/t.sock");
  EXPECT_EQ(DefaultClientSocketPath(), "/srv/t.sock");
}

TEST(SocketPathsTest, PerUserPathFromXdgRuntimeDir) {
  ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/1000/");
  EXPECT_EQ(PerUserSocketPath(), "/run/user/1000/tensord/tensord.sock");
}

TEST(SocketPathsTest, PerUserPathFallsBackToTmp) {
  {
    ScopedEnv xdg("XDG_RUNTIME_DIR", std::nullopt);
    EXPECT_EQ(PerUserSocketPath(), TmpUserPath());
  }
  {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "");
    EXPECT_EQ(PerUserSocketPath(), TmpUserPath());
  }
  {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "relative/dir");  // invalid per the XDG spec
    EXPECT_EQ(PerUserSocketPath(), TmpUserPath());
  }
}

TEST(SocketPathsTest, DaemonDefault) {
  ScopedEnv tensord_socket("TENSORD_SOCKET", "");  // empty counts as unset
  ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/77");
  if (geteuid() == 0) {
    EXPECT_EQ(DefaultDaemonSocketPath(), "/run/tensord/tensord.sock");
  } else {
    EXPECT_EQ(DefaultDaemonSocketPath(), "/run/user/77/tensord/tensord.sock");
  }
}

TEST(SocketPathsTest, ClientPrefersAPerUserSocketThatExists) {
  ScopedEnv tensord_socket("TENSORD_SOCKET", std::nullopt);
  char dir_template[] = "/tmp/tensord-paths-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string dir = dir_template;
  ScopedEnv xdg("XDG_RUNTIME_DIR", dir);
  EXPECT_EQ(DefaultClientSocketPath(), "/run/tensord/tensord.sock");

  ASSERT_EQ(mkdir((dir + "/tensord").c_str(), 0700), 0);
  std::string path = dir + "/tensord/tensord.sock";
  // A plain file there is not a daemon.
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_EQ(DefaultClientSocketPath(), "/run/tensord/tensord.sock");
  unlink(path.c_str());

  UniqueFd sock(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  ASSERT_EQ(bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(DefaultClientSocketPath(), path);

  unlink(path.c_str());
  rmdir((dir + "/tensord").c_str());
  rmdir(dir.c_str());
}

// What stat says about a directory (or, with `type`, something else) of `owner` and `mode`.
struct stat Entry(uid_t owner, mode_t mode, mode_t type = S_IFDIR) {
  struct stat info {};
  info.st_mode = type | mode;
  info.st_uid = owner;
  return info;
}

using testing::IsOk;
using testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uid_t kUs = 1000;
constexpr uint32_t kTrusted[] = {4242};

absl::Status PerUser(const struct stat& info) {
  return CheckSocketDirectoryInfo("/tmp/tensord-1000", "/tmp/tensord-1000/tensord.sock", info,
                                  SocketDirectoryKind::kPerUser, kUs, kTrusted);
}

absl::Status Other(const struct stat& info) {
  return CheckSocketDirectoryInfo("/srv/t", "/srv/t/tensord.sock", info,
                                  SocketDirectoryKind::kOther, kUs, kTrusted);
}

TEST(SocketDirectoryTest, ThePerUserDirectoryIsOursAndPrivate) {
  EXPECT_THAT(PerUser(Entry(kUs, 0700)), IsOk());
  // Planted by someone else, root included: refused, saying who owns it and what to do.
  EXPECT_THAT(PerUser(Entry(65534, 0755)),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("socket directory /tmp/tensord-1000"),
                             HasSubstr("owned by uid 65534"), HasSubstr("mode 0755"),
                             HasSubstr("/tmp/tensord-1000/tensord.sock"),
                             HasSubstr("uid 1000 with mode 0700"), HasSubstr("have it removed"),
                             HasSubstr("TENSORD_SOCKET"))));
  EXPECT_THAT(PerUser(Entry(0, 0700)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("owned by uid 0")));
  EXPECT_THAT(PerUser(Entry(4242, 0700)),  // a trusted daemon uid has its own per-user path
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("owned by uid 4242")));
  // Ours, but open to others: the same rule as the daemon's.
  for (mode_t mode : {0750, 0705, 0755, 0770, 0777, 01777}) {
    EXPECT_THAT(PerUser(Entry(kUs, mode)),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("chmod 0700")))
        << std::oct << mode;
  }
  // lstat's view of a symlink planted there.
  EXPECT_THAT(PerUser(Entry(kUs, 0777, S_IFLNK)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("is not a directory")));
}

TEST(SocketDirectoryTest, AnotherDirectoryBelongsToRootUsOrATrustedUidAndOnlyTheyWrite) {
  EXPECT_THAT(Other(Entry(0, 0755)), IsOk());      // /run/tensord
  EXPECT_THAT(Other(Entry(kUs, 0700)), IsOk());    // a directory of our own
  EXPECT_THAT(Other(Entry(kUs, 0755)), IsOk());
  EXPECT_THAT(Other(Entry(4242, 0750)), IsOk());   // the daemon's own, from trusted_daemon_uids
  EXPECT_THAT(Other(Entry(0, 01777)), IsOk());     // /tmp: sticky, so no one renames our socket
  EXPECT_THAT(Other(Entry(0, 0775)), IsOk());      // root chose the group
  // Someone else's.
  EXPECT_THAT(Other(Entry(65534, 0755)),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("socket directory /srv/t"), HasSubstr("owned by uid 65534"),
                             HasSubstr("mode 0755"), HasSubstr("/srv/t/tensord.sock"),
                             HasSubstr("trusted daemon uid"),
                             HasSubstr("if uid 65534 runs the daemon, trust it (trusted_daemon_uids, "
                                       "$TENSORD_TRUSTED_DAEMON_UIDS)"))));
  // Writable by others than its owner: trusting the owner would not help, so no such hint.
  EXPECT_THAT(Other(Entry(kUs, 0775)),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("mode 0775"), ::testing::Not(HasSubstr("trust it")))));
  EXPECT_THAT(Other(Entry(kUs, 01777)),  // sticky, but not root's
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("mode 1777")));
  EXPECT_THAT(Other(Entry(0, 0777)),  // root's, but not sticky
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("mode 0777")));
  EXPECT_THAT(Other(Entry(4242, 0757)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("mode 0757")));
  EXPECT_THAT(Other(Entry(0, 0755, S_IFREG)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("is not a directory")));
}

TEST(SocketDirectoryTest, RealDirectoriesAreCheckedWithTheRuleForTheirPath) {
  char dir_template[] = "/tmp/tensord-dirs-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;  // ours, 0700
  const uid_t us = geteuid();
  EXPECT_THAT(CheckSocketDirectory(dir + "/t.sock", us, {}), IsOk());
  EXPECT_THAT(CheckSocketDirectory(dir + "/missing/t.sock", us, {}),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(dir + "/missing does not exist")));
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);  // writable by all, not sticky: refused for anyone
  EXPECT_THAT(CheckSocketDirectory(dir + "/t.sock", us, {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("mode 0777")));
  ASSERT_EQ(chmod(dir.c_str(), 0700), 0);

  // The per-user directory under XDG_RUNTIME_DIR is held to the per-user rule.
  ScopedEnv xdg("XDG_RUNTIME_DIR", dir);
  const std::string per_user = PerUserSocketPath();
  const std::string per_user_dir = dir + "/tensord";
  ASSERT_EQ(per_user, per_user_dir + "/tensord.sock");
  ASSERT_EQ(mkdir(per_user_dir.c_str(), 0700), 0);
  EXPECT_THAT(CheckSocketDirectory(per_user, us, {}), IsOk());
  ASSERT_EQ(chmod(per_user_dir.c_str(), 0755), 0);
  EXPECT_THAT(CheckSocketDirectory(per_user, us, {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("mode 0755")));
  // The same directory named as a configured path passes: 0755 and ours.
  EXPECT_THAT(CheckSocketDirectory(per_user_dir + "/other.sock", us, {}), IsOk());
  // A symlink where the per-user directory belongs, even to a good directory, is refused.
  ASSERT_EQ(rmdir(per_user_dir.c_str()), 0);
  const std::string elsewhere = dir + "/elsewhere";
  ASSERT_EQ(mkdir(elsewhere.c_str(), 0700), 0);
  ASSERT_EQ(symlink(elsewhere.c_str(), per_user_dir.c_str()), 0);
  EXPECT_THAT(CheckSocketDirectory(per_user, us, {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("is not a directory")));
  std::filesystem::remove_all(dir);
}

TEST(SocketPathsTest, TrustedDaemonUidsComeFromTheEnvironmentWhenSet) {
  {
    ScopedEnv unset(kTrustedDaemonUidsEnv, std::nullopt);
    EXPECT_THAT(TrustedDaemonUidsFromEnvironment(), testing::IsOkAndHolds(::testing::IsEmpty()));
  }
  {
    ScopedEnv blank(kTrustedDaemonUidsEnv, " ");
    EXPECT_THAT(TrustedDaemonUidsFromEnvironment(), testing::IsOkAndHolds(::testing::IsEmpty()));
  }
  {
    ScopedEnv two(kTrustedDaemonUidsEnv, "10001, 42 ,0");
    EXPECT_THAT(TrustedDaemonUidsFromEnvironment(), testing::IsOkAndHolds(::testing::ElementsAre(10001u, 42u, 0u)));
  }
  for (const char* bad : {"abc", "10001,", "-1", "+5", "4294967295", "4294967296", "1 2", "0x10"}) {
    ScopedEnv env(kTrustedDaemonUidsEnv, bad);
    absl::StatusOr<std::vector<uint32_t>> uids = TrustedDaemonUidsFromEnvironment();
    EXPECT_EQ(uids.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(uids.status().message(), HasSubstr("$TENSORD_TRUSTED_DAEMON_UIDS")) << bad;
  }
}

TEST(SocketPathsTest, DerivedPaths) {
  EXPECT_EQ(FdChannelPath("/run/tensord/tensord.sock"), "/run/tensord/tensord.sock.fd");
  EXPECT_EQ(LockPath("/run/tensord/tensord.sock"), "/run/tensord/tensord.sock.lock");
}

}  // namespace
}  // namespace tensord::common
