#include "server/config.h"

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"

namespace tensord::server {
namespace {

TEST(Config, ParseByteSizeUnderstandsUnits) {
  EXPECT_EQ(*ParseByteSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("4G"), 4ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseByteSize("1000"), 1000u);
  EXPECT_EQ(*ParseByteSize("2GB"), 2000000000u);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("-1G").ok());
  EXPECT_FALSE(ParseByteSize("lots").ok());
  EXPECT_FALSE(ParseByteSize("99999999999T").ok());
}

TEST(Config, FlagsBeatEnvironmentWhichBeatsTheFile) {
  std::string path = ::testing::TempDir() + "/tensord_config_test.toml";
  {
    std::ofstream file(path);
    file << "socket = \"/from/file.sock\"\nmax_host_bytes = \"1GiB\"\nlog_level = \"debug\"\n"
         << "[acl.shared]\nread_uids = [1000]\nwrite_gids = [50]\n";
  }
  setenv("TENSORD_MAX_HOST_BYTES", "2GiB", 1);
  std::string config_flag = "--config=" + path;
  const char* argv[] = {"tensord", config_flag.c_str(), "--log-level", "warn"};
  auto config = LoadConfig(4, const_cast<char**>(argv));
  unsetenv("TENSORD_MAX_HOST_BYTES");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->socket, "/from/file.sock");
  EXPECT_EQ(config->max_host_bytes, 2ull << 30);
  EXPECT_EQ(config->log_level, "warn");
  ASSERT_EQ(config->acls.count("shared"), 1u);
  EXPECT_EQ(config->acls.at("shared").read_uids, std::vector<uid_t>{1000});
  EXPECT_EQ(config->acls.at("shared").write_gids, std::vector<gid_t>{50});
}

TEST(Config, UnknownKeysAndBadFilesAreErrorsNamingThem) {
  std::string path = ::testing::TempDir() + "/tensord_config_bad.toml";
  {
    std::ofstream file(path);
    file << "sockett = \"/x\"\n";
  }
  std::string flag = "--config=" + path;
  const char* argv[] = {"tensord", flag.c_str()};
  auto config = LoadConfig(2, const_cast<char**>(argv));
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("sockett"), std::string::npos);
}

TEST(Config, DefaultHostLimitIsHalfOfWhatWeMayUse) {
  uint64_t limit = DefaultMaxHostBytes();
  EXPECT_GT(limit, 0u);
  const char* argv[] = {"tensord"};
  auto config = LoadConfig(1, const_cast<char**>(argv));
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->max_host_bytes, limit);
}

TEST(Config, CapsHaveDefaultsAndTheUsualPrecedence) {
  const char* bare[] = {"tensord"};
  auto defaults = LoadConfig(1, const_cast<char**>(bare));
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->max_sessions, 4096u);
  EXPECT_EQ(defaults->max_leases_per_session, 1048576u);
  EXPECT_EQ(defaults->max_waits_per_session, 1024u);

  std::string path = ::testing::TempDir() + "/tensord_config_caps.toml";
  {
    std::ofstream file(path);
    file << "max_sessions = 10\nmax_leases_per_session = 11\nmax_waits_per_session = 12\n";
  }
  setenv("TENSORD_MAX_LEASES_PER_SESSION", "21", 1);
  setenv("TENSORD_MAX_WAITS_PER_SESSION", "22", 1);
  std::string flag = "--config=" + path;
  const char* argv[] = {"tensord", flag.c_str(), "--max-waits-per-session", "32"};
  auto config = LoadConfig(4, const_cast<char**>(argv));
  unsetenv("TENSORD_MAX_LEASES_PER_SESSION");
  unsetenv("TENSORD_MAX_WAITS_PER_SESSION");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->max_sessions, 10u);            // file
  EXPECT_EQ(config->max_leases_per_session, 21u);  // environment over file
  EXPECT_EQ(config->max_waits_per_session, 32u);   // flag over environment
}

TEST(Config, BadCapsAreErrorsNamingTheSetting) {
  for (const char* value : {"0", "-1", "many", "1.5", "99999999999999"}) {
    const char* argv[] = {"tensord", "--max-sessions", value};
    auto config = LoadConfig(3, const_cast<char**>(argv));
    ASSERT_FALSE(config.ok()) << value;
    EXPECT_NE(config.status().message().find("--max-sessions"), std::string::npos) << config.status();
  }
  setenv("TENSORD_MAX_WAITS_PER_SESSION", "0", 1);
  const char* bare[] = {"tensord"};
  auto from_env = LoadConfig(1, const_cast<char**>(bare));
  unsetenv("TENSORD_MAX_WAITS_PER_SESSION");
  ASSERT_FALSE(from_env.ok());
  EXPECT_NE(from_env.status().message().find("max-waits-per-session"), std::string::npos);

  std::string path = ::testing::TempDir() + "/tensord_config_bad_caps.toml";
  {
    std::ofstream file(path);
    file << "max_leases_per_session = \"lots\"\n";
  }
  std::string flag = "--config=" + path;
  const char* argv[] = {"tensord", flag.c_str()};
  auto from_file = LoadConfig(2, const_cast<char**>(argv));
  ASSERT_FALSE(from_file.ok());
  EXPECT_NE(from_file.status().message().find("max_leases_per_session"), std::string::npos);
}

TEST(Config, ArenaSettingsComeFromFlagsEnvironmentAndFile) {
  {
    const char* argv[] = {"tensord"};
    auto config = LoadConfig(1, const_cast<char**>(argv));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->arena_bytes, kDefaultArenaBytes);
    EXPECT_EQ(config->arena_max_tensor_bytes, kDefaultArenaMaxTensorBytes);
  }
  std::string path = ::testing::TempDir() + "/tensord_arena_config_test.toml";
  {
    std::ofstream file(path);
    file << "arena_bytes = \"64MiB\"\narena_max_tensor = 10000\n";
  }
  setenv("TENSORD_ARENA_BYTES", "32MiB", 1);
  std::string config_flag = "--config=" + path;
  {
    const char* argv[] = {"tensord", config_flag.c_str()};
    auto config = LoadConfig(2, const_cast<char**>(argv));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->arena_bytes, 32ull << 20);
    EXPECT_EQ(config->arena_max_tensor_bytes, 12288u);  // whole pages
  }
  unsetenv("TENSORD_ARENA_BYTES");
  {
    const char* argv[] = {"tensord", "--arena-bytes", "0"};
    auto config = LoadConfig(3, const_cast<char**>(argv));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->arena_bytes, 0u);
  }
  {
    const char* argv[] = {"tensord", "--arena-bytes", "1MiB", "--arena-max-tensor", "2MiB"};
    auto config = LoadConfig(5, const_cast<char**>(argv));
    ASSERT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find("--arena-max-tensor"), std::string::npos) << config.status();
  }
  {
    const char* argv[] = {"tensord", "--arena-bytes", "lots"};
    auto config = LoadConfig(3, const_cast<char**>(argv));
    ASSERT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find("--arena-bytes"), std::string::npos) << config.status();
  }
}

}  // namespace
}  // namespace tensord::server
