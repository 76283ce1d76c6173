// The daemon's limits in its configuration: the default host memory quota, caps per session
// and per uid, arenas and device memory limits, from flags, the environment and a TOML file,
// and errors that name the setting.
#include "server/daemon/config.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/memory/arena.h"
#include "tests/unit/common/status_matchers.h"
#include "tests/unit/server/config_fixture.h"

namespace tensord::server {
namespace {

using common::testing::IsOk;
using common::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Field;
using testing::Load;
using testing::ScopedEnv;
using testing::WriteToml;

TEST(Config, DefaultHostLimitIsHalfOfWhatWeMayUse) {
  uint64_t limit = DefaultMaxHostBytes();
  EXPECT_GT(limit, 0u);
  const char* argv[] = {"tensord"};
  auto config = LoadConfig(1, const_cast<char**>(argv));
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->max_host_bytes, limit);
  EXPECT_NE(config->max_host_bytes_source.find("half of"), std::string::npos) << config->max_host_bytes_source;
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

TEST(Config, PerUidLimitsHaveDefaults) {
  absl::StatusOr<Config> config = Load({});
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->max_sessions_per_uid, 1024u);
  EXPECT_EQ(config->max_connections_per_uid, 1024u);
  EXPECT_EQ(config->max_grpc_connections, 8192u);
  EXPECT_EQ(config->max_tensors_per_uid, 262144u);
  EXPECT_EQ(config->max_waits_per_uid, 8192u);
  EXPECT_EQ(config->max_watchers_per_uid, 256u);
  EXPECT_EQ(config->max_metadata_bytes_per_uid, 256ull << 20);
  EXPECT_EQ(config->max_host_bytes_per_uid, DefaultMaxHostBytes() / 4);
  // A quarter of the quota, wherever the quota came from.
  EXPECT_EQ(Load({"--max-host-bytes", "4GiB"})->max_host_bytes_per_uid, 1ull << 30);
  EXPECT_EQ(Load({"--max-host-bytes", "3"})->max_host_bytes_per_uid, 1u);
}

// Each new limit, set in the file, the environment and a flag, and given a bad value.
TEST(Config, PerUidLimitsComeFromFlagsEnvironmentAndFile) {
  struct Case {
    const char* key;
    uint64_t Config::*field;
    const char* file_value;  // TOML
    uint64_t from_file;
    const char* env_value;
    uint64_t from_env;
    const char* flag_value;
    uint64_t from_flag;
    const char* bad;
  };
  const Case cases[] = {
      {"max_sessions_per_uid", &Config::max_sessions_per_uid, "10", 10, "20", 20, "30", 30, "1.5"},
      {"max_connections_per_uid", &Config::max_connections_per_uid, "11", 11, "21", 21, "31", 31, "0"},
      {"max_grpc_connections", &Config::max_grpc_connections, "12", 12, "22", 22, "32", 32, "0x20"},
      {"max_tensors_per_uid", &Config::max_tensors_per_uid, "13", 13, "23", 23, "33", 33, "4294967297"},
      {"max_waits_per_uid", &Config::max_waits_per_uid, "14", 14, "24", 24, "34", 34, "-1"},
      {"max_watchers_per_uid", &Config::max_watchers_per_uid, "15", 15, "25", 25, "35", 35, "1e3"},
      {"max_metadata_bytes_per_uid", &Config::max_metadata_bytes_per_uid, "\"1MiB\"", 1 << 20, "2MiB", 2 << 20,
       "3000", 3000, "0.5"},
      {"max_host_bytes_per_uid", &Config::max_host_bytes_per_uid, "1048576", 1 << 20, "2M", 2 << 20, "3KB", 3000,
       "9999999TiB"},
  };
  for (const Case& c : cases) {
    std::string path = WriteToml(absl::StrCat("max_host_bytes = \"1GiB\"\n", c.key, " = ", c.file_value, "\n"),
                                 absl::StrCat("_", c.key));
    std::string flag = absl::StrCat("--", absl::StrReplaceAll(c.key, {{"_", "-"}}));
    std::string env = absl::StrCat("TENSORD_", absl::AsciiStrToUpper(c.key));
    EXPECT_EQ(Field(Load({"--config", path}), c.field), c.from_file) << c.key;
    {
      ScopedEnv from_env(env.c_str(), c.env_value);
      EXPECT_EQ(Field(Load({"--config", path}), c.field), c.from_env) << c.key;
      EXPECT_EQ(Field(Load({"--config", path, flag, c.flag_value}), c.field), c.from_flag) << c.key;
    }
    EXPECT_THAT(Load({flag, c.bad}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(absl::StrCat(flag, " '", c.bad, "': "))))
        << c.key;
    ScopedEnv bad_env(env.c_str(), c.bad);
    EXPECT_THAT(Load({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr(absl::StrCat("environment ", env, " (", flag, ") '", c.bad, "': "))))
        << c.key;
  }
  std::string path = WriteToml("max_watchers_per_uid = 2.0\n", "_bad");
  EXPECT_THAT(Load({"--config", path}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("config ", path, ":1: max_watchers_per_uid 2.0: a count must be"))));
}

TEST(Config, PerUidHostBytesAboveTheQuotaIsAnErrorNamingBoth) {
  EXPECT_EQ(Load({"--max-host-bytes", "1GiB", "--max-host-bytes-per-uid", "1GiB"})->max_host_bytes_per_uid, 1ull << 30);
  EXPECT_THAT(Load({"--max-host-bytes", "1GiB", "--max-host-bytes-per-uid", "2GiB"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max-host-bytes-per-uid (2147483648 bytes) is larger than the host memory quota of "
                                 "all uids, max_host_bytes (1073741824 bytes, --max-host-bytes)")));
  ScopedEnv env("TENSORD_MAX_HOST_BYTES_PER_UID", "8388607TiB");
  EXPECT_THAT(Load({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                 AllOf(HasSubstr("environment TENSORD_MAX_HOST_BYTES_PER_UID (--max-host-bytes-per-uid) "
                                                 "(9223370937343148032 bytes) is larger than"),
                                       HasSubstr("half of"))));
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
    const uint64_t page = ArenaAlignment();  // 10000 bytes up to whole pages
    EXPECT_EQ(config->arena_max_tensor_bytes, (10000 + page - 1) / page * page);
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

TEST(DeviceLimits, OneValueForEveryDeviceOrPerDeviceEntries) {
  auto all = ParseDeviceLimits("8GiB");
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(all->all, uint64_t{8} << 30);
  EXPECT_TRUE(all->by_device.empty());

  auto mixed = ParseDeviceLimits(" 4G , GPU-3f1c2a9e-0000-1111-2222-333344445555=20GiB,cuda:1=1MiB");
  ASSERT_THAT(mixed, IsOk());
  EXPECT_EQ(mixed->all, uint64_t{4} << 30);
  EXPECT_EQ(mixed->by_device.at("GPU-3f1c2a9e-0000-1111-2222-333344445555"), uint64_t{20} << 30);
  EXPECT_EQ(mixed->by_device.at("cuda:1"), uint64_t{1} << 20);
  auto named_only = ParseDeviceLimits("cuda:0=1G");
  ASSERT_THAT(named_only, IsOk());
  EXPECT_EQ(named_only->all, 0u);
}

TEST(DeviceLimits, RefusesWhatItCannotReadNamingTheEntry) {
  EXPECT_THAT(ParseDeviceLimits("8GiB,,cuda:0=1G"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty entry")));
  EXPECT_THAT(ParseDeviceLimits("gpu0=1G"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'gpu0=1G': name the device by its UUID")));
  EXPECT_THAT(ParseDeviceLimits("cuda:x=1G"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UUID")));
  EXPECT_THAT(ParseDeviceLimits("cuda:0=lots"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'cuda:0=lots'")));
  EXPECT_THAT(ParseDeviceLimits("1G,2G"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("two values")));
  EXPECT_THAT(ParseDeviceLimits("cuda:0=1G,cuda:0=2G"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'cuda:0' is given twice")));
}

TEST(DeviceLimits, TheFlagTheVariableAndTheFileAreNamedInErrors) {
  auto flag = Load({"--max-device-bytes", "cuda:0=2GiB"});
  ASSERT_THAT(flag, IsOk());
  EXPECT_EQ(flag->device_limits.by_device.at("cuda:0"), uint64_t{2} << 30);
  EXPECT_EQ(flag->device_limits.source, "--max-device-bytes");
  EXPECT_THAT(Load({"--max-device-bytes", "nope=1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-device-bytes 'nope=1'")));
  {
    ScopedEnv env("TENSORD_MAX_DEVICE_BYTES", "1G,2G");
    EXPECT_THAT(Load({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("environment TENSORD_MAX_DEVICE_BYTES (--max-device-bytes) '1G,2G'")));
  }
  std::string path = WriteToml("max_device_bytes = \"16GiB\"\n");
  auto file = Load({"--config", path});
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ(file->device_limits.all, uint64_t{16} << 30);
  EXPECT_THAT(file->device_limits.source, HasSubstr(path + ":1"));
}

}  // namespace
}  // namespace tensord::server
