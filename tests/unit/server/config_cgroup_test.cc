// Finding the memory limit of the daemon's cgroup (v1, v2, or both mounted) in a fake
// /sys/fs/cgroup: the smallest limit on the way to the root wins, "no limit" and garbage mean
// none.
#include "server/daemon/config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tensord::server {
namespace {

// A fake /sys/fs/cgroup under the test's temporary directory, removed at the end.
class FakeCgroupRoot {
 public:
  FakeCgroupRoot()
      : root_(absl::StrCat(::testing::TempDir(), "/cgroup_",
                           ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_", getpid())) {
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  ~FakeCgroupRoot() { std::filesystem::remove_all(root_); }

  // Writes `contents` to <root>/<file>, creating the directories on the way.
  void Write(const std::string& file, const std::string& contents) const {
    std::filesystem::path path = root_ + "/" + file;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << contents;
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

TEST(CgroupMemoryLimit, V2AncestorSmallerThanTheLeafWins) {
  FakeCgroupRoot fake;
  fake.Write("a/memory.max", "4294967296\n");
  fake.Write("a/b/memory.max", "max\n");
  fake.Write("a/b/c/memory.max", "8589934592\n");
  CgroupMemoryLimit limit = FindCgroupMemoryLimit("0::/a/b/c\n", fake.root());
  EXPECT_EQ(limit.bytes, 4ull << 30);
  EXPECT_EQ(limit.file, fake.root() + "/a/memory.max");
}

TEST(CgroupMemoryLimit, V1CombinedControllerLine) {
  FakeCgroupRoot fake;
  // Mounted under its controller list, with no memory/ link.
  fake.Write("cpu,memory/memory.limit_in_bytes", "9223372036854771712\n");
  fake.Write("cpu,memory/docker/memory.limit_in_bytes", "4294967296\n");
  fake.Write("cpu,memory/docker/x/memory.limit_in_bytes", "9223372036854771712\n");
  CgroupMemoryLimit limit =
      FindCgroupMemoryLimit("12:pids:/docker/x\n4:cpu,memory:/docker/x\n1:name=systemd:/docker/x\n", fake.root());
  EXPECT_EQ(limit.bytes, 4ull << 30);
  EXPECT_EQ(limit.file, fake.root() + "/cpu,memory/docker/memory.limit_in_bytes");

  FakeCgroupRoot plain;
  plain.Write("memory/docker/x/memory.limit_in_bytes", "1073741824");
  EXPECT_EQ(FindCgroupMemoryLimit("4:memory:/docker/x\n", plain.root()).bytes, 1ull << 30);
}

TEST(CgroupMemoryLimit, V1AndV2BothPresentTheSmallestWins) {
  FakeCgroupRoot fake;
  fake.Write("memory/job/memory.limit_in_bytes", "3221225472\n");
  fake.Write("unified/job/memory.max", "2147483648\n");
  fake.Write("job/memory.max", "6442450944\n");
  CgroupMemoryLimit limit = FindCgroupMemoryLimit("4:memory:/job\n0::/job\n", fake.root());
  EXPECT_EQ(limit.bytes, 2ull << 30);
  EXPECT_EQ(limit.file, fake.root() + "/unified/job/memory.max");

  fake.Write("memory/job/memory.limit_in_bytes", "1073741824\n");
  limit = FindCgroupMemoryLimit("0::/job\n4:memory:/job\n", fake.root());
  EXPECT_EQ(limit.bytes, 1ull << 30);
  EXPECT_EQ(limit.file, fake.root() + "/memory/job/memory.limit_in_bytes");
}

TEST(CgroupMemoryLimit, MaxAndV1NoLimitMeanNone) {
  FakeCgroupRoot fake;
  fake.Write("a/memory.max", "max\n");
  fake.Write("memory/a/memory.limit_in_bytes", "9223372036854771712\n");
  fake.Write("memory/memory.limit_in_bytes", "9223372036854710272\n");  // 64 KiB pages
  CgroupMemoryLimit limit = FindCgroupMemoryLimit("0::/a\n5:memory:/a\n", fake.root());
  EXPECT_EQ(limit.bytes, 0u);
  EXPECT_EQ(limit.file, "");
}

TEST(CgroupMemoryLimit, MissingFilesAndGarbageAreNone) {
  FakeCgroupRoot fake;
  EXPECT_EQ(FindCgroupMemoryLimit("0::/nowhere\n4:memory:/nowhere\n", fake.root()).bytes, 0u);
  EXPECT_EQ(FindCgroupMemoryLimit("", fake.root()).bytes, 0u);
  EXPECT_EQ(FindCgroupMemoryLimit("garbage\n::\n0:\n", fake.root()).bytes, 0u);
  for (const char* contents : {"", "lots\n", "-1\n", "0x1000\n", "12 34\n", "0\n",
                               "99999999999999999999999\n", "1e9\n"}) {
    fake.Write("a/memory.max", contents);
    EXPECT_EQ(FindCgroupMemoryLimit("0::/a\n", fake.root()).bytes, 0u) << contents;
  }
  // A directory where the file should be.
  std::filesystem::remove(fake.root() + "/a/memory.max");
  std::filesystem::create_directories(fake.root() + "/a/memory.max");
  EXPECT_EQ(FindCgroupMemoryLimit("0::/a\n", fake.root()).bytes, 0u);
}

TEST(CgroupMemoryLimit, APathMissingUnderTheMountFallsBackToTheMountRoot) {
  // A container without a cgroup namespace sees the host's path in /proc/self/cgroup, with
  // its own cgroup mounted as the root.
  FakeCgroupRoot v2;
  v2.Write("memory.max", "536870912\n");
  CgroupMemoryLimit limit = FindCgroupMemoryLimit("0::/system.slice/docker-1.scope\n", v2.root());
  EXPECT_EQ(limit.bytes, 512ull << 20);
  EXPECT_EQ(limit.file, v2.root() + "/memory.max");
  // With a cgroup namespace the path is "/".
  EXPECT_EQ(FindCgroupMemoryLimit("0::/\n", v2.root()).bytes, 512ull << 20);

  FakeCgroupRoot v1;
  v1.Write("memory/memory.limit_in_bytes", "4294967296\n");
  EXPECT_EQ(FindCgroupMemoryLimit("9:memory:/docker/abc\n", v1.root()).bytes, 4ull << 30);
  // A path that climbs out of the mount is not followed.
  v1.Write("elsewhere/memory.max", "1024\n");
  EXPECT_EQ(FindCgroupMemoryLimit("0::/../elsewhere\n", v1.root() + "/memory").bytes, 0u);
}

}  // namespace
}  // namespace tensord::server
