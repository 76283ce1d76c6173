#include "common/socket_paths.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "common/unique_fd.h"
#include "gtest/gtest.h"

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

TEST(SocketPathsTest, DerivedPaths) {
  EXPECT_EQ(FdChannelPath("/run/tensord/tensord.sock"), "/run/tensord/tensord.sock.fd");
  EXPECT_EQ(LockPath("/run/tensord/tensord.sock"), "/run/tensord/tensord.sock.lock");
}

}  // namespace
}  // namespace tensord::common
