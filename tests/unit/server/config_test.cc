#include "server/daemon/config.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/memory/arena.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::server {
namespace {

using common::testing::IsOk;
using common::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// LoadConfig(tensord <args>).
absl::StatusOr<Config> Load(std::vector<std::string> args) {
  std::string name = "tensord";
  std::vector<char*> argv = {name.data()};
  for (std::string& arg : args) argv.push_back(arg.data());
  return LoadConfig(static_cast<int>(argv.size()), argv.data());
}

// Writes `contents` to a TOML file named after the running test (and `suffix`) and returns
// its path.
std::string WriteToml(const std::string& contents, const std::string& suffix = "") {
  std::string path = absl::StrCat(::testing::TempDir(), "/tensord_",
                                  ::testing::UnitTest::GetInstance()->current_test_info()->name(), suffix, ".toml");
  std::ofstream(path) << contents;
  return path;
}

// `field` of a configuration that must have loaded.
uint64_t Field(const absl::StatusOr<Config>& config, uint64_t Config::*field) {
  EXPECT_THAT(config, IsOk());
  return config.ok() ? *config.*field : 0;
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

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

TEST(Config, SizesKeepEveryDocumentedForm) {
  EXPECT_EQ(*ParseByteSize("1"), 1u);
  EXPECT_EQ(*ParseByteSize("64KiB"), 64u << 10);
  EXPECT_EQ(*ParseByteSize("4g"), 4ull << 30);
  EXPECT_EQ(*ParseByteSize("4gib"), 4ull << 30);
  EXPECT_EQ(*ParseByteSize("16M"), 16u << 20);
  EXPECT_EQ(*ParseByteSize("1T"), 1ull << 40);
  EXPECT_EQ(*ParseByteSize("3KB"), 3000u);
  EXPECT_EQ(*ParseByteSize("1TB"), 1000000000000u);
  EXPECT_EQ(*ParseByteSize("1.5K"), 1536u);
  EXPECT_EQ(*ParseByteSize("0.5GiB"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("1.1MB"), 1100000u);
  EXPECT_EQ(*ParseByteSize("2.000B"), 2u);
  EXPECT_EQ(*ParseByteSize(" 4G\n"), 4ull << 30);  // around it, whitespace is ignored
  EXPECT_EQ(*ParseByteSize("9223372036854775807"), uint64_t{INT64_MAX});
  EXPECT_EQ(*ParseByteSize("8388607TiB"), 8388607ull << 40);
  EXPECT_EQ(*ParseByteSize("0.0000000298023223876953125TiB"), 32768u);  // exact arithmetic
}

TEST(Config, SizesRefuseWhatUsedToBeGuessed) {
  const std::pair<const char*, const char*> cases[] = {
      {"9999999TiB", "too large"},
      {"9223372036854775808", "too large"},
      {"8388608TiB", "too large"},
      {"18446744073709551616", "too large"},
      {"99999999999999999999999", "too large"},
      {"16384PiB", "unknown unit"},
      {"0.5", "a fraction needs a unit"},
      {"1.5", "a fraction needs a unit"},
      {"1e-300", "scientific notation"},
      {"1e3", "scientific notation"},
      {"1E9B", "scientific notation"},
      {"0x10", "hexadecimal"},
      {"0X10", "hexadecimal"},
      {"010", "leading zeros"},
      {"+1G", "no sign"},
      {"-1G", "no sign"},
      {"4 GiB", "whitespace"},
      {"1 000", "whitespace"},
      {"0", "at least 1 byte"},
      {"0GiB", "at least 1 byte"},
      {"0.0MiB", "at least 1 byte"},
      {"0.1B", "not a whole number of bytes"},
      {"1.0000001K", "not a whole number of bytes"},
      {".5GiB", "a size is a decimal number"},
      {"5.GiB", "a size is a decimal number"},
      {"", "empty"},
      {"lots", "a size is a decimal number"},
      {"inf", "a size is a decimal number"},
      {"nan", "a size is a decimal number"},
      {"4Gibibytes", "unknown unit"},
  };
  for (const auto& [text, reason] : cases) {
    EXPECT_THAT(ParseByteSize(text),
                StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(absl::StrCat("'", text, "'")), HasSubstr(reason))))
        << text;
  }
}

TEST(Config, CountsArePlainDecimalIntegers) {
  EXPECT_THAT(Load({"--max-sessions", "1"}), IsOk());
  EXPECT_THAT(Load({"--max-sessions", "4294967296"}), IsOk());
  EXPECT_EQ(Load({"--max-sessions", " 7 "})->max_sessions, 7u);
  const std::pair<const char*, const char*> cases[] = {
      {"0", "from 1 to"},          {"4294967297", "too large"}, {"99999999999999999999999", "too large"},
      {"0x10", "hexadecimal"},     {"010", "leading zeros"},    {"+5", "no sign"},
      {"-5", "no sign"},           {"1e3", "scientific"},       {"1.0", "no fraction"},
      {"0.5", "no fraction"},      {"5 5", "whitespace"},       {"5k", "whole decimal number"},
      {"", "empty"},
  };
  for (const auto& [text, reason] : cases) {
    EXPECT_THAT(Load({"--max-leases-per-session", text}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("--max-leases-per-session '", text, "'")), HasSubstr(reason))))
        << text;
  }
}

TEST(Config, BadValuesNameTheFlagTheVariableOrTheFileKey) {
  EXPECT_THAT(Load({"--max-host-bytes", "9999999TiB"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-host-bytes '9999999TiB': too large")));
  EXPECT_THAT(Load({"--max-host-bytes=0x10"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-host-bytes '0x10': hexadecimal")));
  {
    ScopedEnv env("TENSORD_MAX_HOST_BYTES", "0.5");
    EXPECT_THAT(Load({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("environment TENSORD_MAX_HOST_BYTES (--max-host-bytes) '0.5'")));
    // The flag wins, so the variable is not read.
    EXPECT_THAT(Load({"--max-host-bytes", "1G"}), IsOk());
  }
  std::string path = WriteToml("socket = \"/x\"\nmax_host_bytes = \"1e-300\"\n");
  EXPECT_THAT(Load({"--config", path}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(absl::StrCat("config ", path, ":2: max_host_bytes '1e-300'")),
                             HasSubstr("scientific notation"))));
  // An empty flag is refused (by CLI11); an empty variable counts as unset.
  EXPECT_THAT(Load({"--max-sessions="}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-sessions")));
  ScopedEnv empty("TENSORD_MAX_SESSIONS", "");
  EXPECT_THAT(Load({}), IsOk());
}

TEST(Config, TomlValuesOfTheWrongTypeAreRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {"max_host_bytes = true", "max_host_bytes true: a size must be a TOML integer (bytes) or a string"},
      {"max_host_bytes = 1.5e9", "max_host_bytes 1500000000.0: a size must be a TOML integer"},
      {"max_host_bytes = [1]", "max_host_bytes (an array): a size must be"},
      {"max_host_bytes = { a = 1 }", "max_host_bytes (a table): a size must be"},
      {"max_host_bytes = 0", "max_host_bytes 0: a size is at least 1 byte"},
      {"max_host_bytes = -5", "max_host_bytes -5: a size is at least 1 byte"},
      {"max_host_bytes = \"0x10\"", "max_host_bytes '0x10': hexadecimal"},
      {"max_sessions = 1.0", "max_sessions 1.0: a count must be a TOML integer, like 4096, not a floating-point"},
      {"max_sessions = true", "max_sessions true: a count must be a TOML integer"},
      {"max_sessions = \"10\"", "max_sessions '10': a count must be a TOML integer, like 4096, not a string"},
      {"max_sessions = 0", "max_sessions 0: a count is a whole number from 1 to"},
      {"max_sessions = 4294967297", "max_sessions 4294967297: a count is a whole number from 1 to"},
      {"arena_bytes = -1", "arena_bytes -1: a size is 0 (off) or at least 1 byte"},
      {"arena_bytes = 1979-05-27", "arena_bytes (a date): a size must be"},
      {"socket = 5", "socket 5: must be a TOML string, not an integer"},
      {"log_level = false", "log_level false: must be a TOML string, not a boolean"},
  };
  int i = 0;
  for (const auto& [line, message] : cases) {
    std::string path = WriteToml(absl::StrCat("\n", line, "\n"), absl::StrCat("_", i++));
    EXPECT_THAT(Load({"--config", path}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(absl::StrCat("config ", path, ":2: ", message))))
        << line;
  }
  // What the file may hold: integers and strings for sizes, integers for counts.
  std::string path = WriteToml("max_host_bytes = 1073741824\narena_bytes = \"0\"\nmax_sessions = 9\n", "_good");
  absl::StatusOr<Config> config = Load({"--config", path});
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->max_host_bytes, 1ull << 30);
  EXPECT_EQ(config->max_host_bytes_source, absl::StrCat("config ", path, ":1: max_host_bytes"));
  EXPECT_EQ(config->arena_bytes, 0u);
  EXPECT_EQ(config->max_sessions, 9u);
}

// --print-config: every key with where its value came from, as a file that reads back to
// the same configuration.
TEST(Config, PrintedConfigSaysWhereEachValueCameFromAndReadsBack) {
  std::string path = WriteToml("max_sessions = 7\nlog_level = \"debug\"\n[acl.\"team.a\"]\nread_uids = [1000, 1001]\n");
  ScopedEnv env("TENSORD_MAX_LEASES_PER_SESSION", "99");
  absl::StatusOr<Config> config = Load({"--config", path, "--arena-bytes", "0", "--socket", "/tmp/x \"y\".sock"});
  ASSERT_THAT(config, IsOk());
  const std::string printed = PrintedConfig(*config);
  EXPECT_THAT(printed, AllOf(HasSubstr(absl::StrCat("max_sessions = 7  # config ", path, ":1: max_sessions\n")),
                             HasSubstr("max_leases_per_session = 99  # environment TENSORD_MAX_LEASES_PER_SESSION "
                                       "(--max-leases-per-session)\n"),
                             HasSubstr("arena_bytes = 0  # --arena-bytes\n"),
                             HasSubstr("socket = \"/tmp/x \\\"y\\\".sock\"  # --socket\n"),
                             HasSubstr(absl::StrCat("max_waits_per_session = ", kDefaultMaxWaitsPerSession, "  # default\n")),
                             HasSubstr("max_host_bytes_per_uid = "), HasSubstr("# default: a quarter of max_host_bytes"),
                             HasSubstr("# socket_group is unset: "), HasSubstr("# max_device_bytes is unset: "),
                             HasSubstr("[acl.\"team.a\"]"), HasSubstr("read_uids = [1000, 1001]\n")));

  std::string again_path = WriteToml(printed, "_printed");
  absl::StatusOr<Config> again = Load({"--config", again_path});
  ASSERT_THAT(again, IsOk()) << printed;
  EXPECT_EQ(again->socket, config->socket);
  EXPECT_EQ(again->log_level, "debug");
  for (uint64_t Config::*field : {&Config::max_sessions, &Config::max_leases_per_session, &Config::max_host_bytes,
                                  &Config::max_host_bytes_per_uid, &Config::arena_bytes, &Config::arena_max_tensor_bytes,
                                  &Config::recycle_bytes_per_session, &Config::max_metadata_bytes_per_uid}) {
    EXPECT_EQ(*again.*field, *config.*field);
  }
  ASSERT_EQ(again->acls.count("team.a"), 1u);
  EXPECT_EQ(again->acls.at("team.a").read_uids, (std::vector<uid_t>{1000, 1001}));
  // Every key the printed file sets came from it now.
  EXPECT_THAT(PrintedConfig(*again), HasSubstr(absl::StrCat("max_sessions = 7  # config ", again_path)));
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

TEST(Config, AclForANamespaceThatCouldNeverMatchIsAnError) {
  const std::pair<const char*, const char*> cases[] = {
      {"[acl.\"bad/ns\"]\nread_uids = [1000]", "config %s:2: [acl.\"bad/ns\"]: could never match a tensor"},
      {"[acl.\"..\"]", "config %s:2: [acl.\"..\"]: could never match a tensor"},
      {"[acl.\"\"]", "config %s:2: [acl.\"\"]: could never match a tensor"},
      {"[acl.\"a b\"]", "config %s:2: [acl.\"a b\"]: could never match a tensor"},
      {"acl = 5", "config %s:2: acl 5: must be [acl.<namespace>] tables, not an integer"},
      {"[acl]\nteam = [1]", "config %s:3: [acl.team]: must be a table, not an array"},
  };
  int i = 0;
  for (const auto& [text, message] : cases) {
    std::string path = WriteToml(absl::StrCat("\n", text, "\n"), absl::StrCat("_", i++));
    EXPECT_THAT(Load({"--config", path}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(absl::StrReplaceAll(message, {{"%s", path}}))))
        << text;
  }
  // '.' is a name character: such a namespace is quoted in TOML and valid.
  std::string path = WriteToml("[acl.\"team.a\"]\nwrite_gids = [0, 4294967294]\n", "_good");
  absl::StatusOr<Config> config = Load({"--config", path});
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->acls.at("team.a").write_gids, (std::vector<gid_t>{0, 4294967294u}));
}

TEST(Config, AclIdsAreIntegersInRange) {
  const std::pair<const char*, const char*> cases[] = {
      {"read_uids = [1000, -1]", "[acl.team] read_uids[1] -1: a uid is an integer from 0 to 4294967294"},
      {"write_uids = [4294967295]", "[acl.team] write_uids[0] 4294967295: a uid is an integer from 0 to"},
      {"read_gids = [4294967296]", "[acl.team] read_gids[0] 4294967296: a gid is an integer from 0 to"},
      {"write_gids = [1.0]", "[acl.team] write_gids[0] 1.0: a gid is an integer from 0 to 4294967294, not a "
                             "floating-point number"},
      {"read_uids = [\"alice\"]", "[acl.team] read_uids[0] 'alice': a uid is an integer"},
      {"read_uids = [true]", "[acl.team] read_uids[0] true: a uid is an integer"},
      {"read_uids = 1000", "[acl.team] read_uids 1000: must be a list of numeric uids, like [1000, 1001]"},
      {"readuids = [1000]", "[acl.team] readuids: unknown key; an ACL has read_uids, write_uids"},
  };
  int i = 0;
  for (const auto& [text, message] : cases) {
    std::string path = WriteToml(absl::StrCat("[acl.team]\n", text, "\n"), absl::StrCat("_", i++));
    EXPECT_THAT(Load({"--config", path}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(absl::StrCat("config ", path, ":2: ", message))))
        << text;
  }
}

TEST(Config, SocketGroupMustNameAnExistingGroup) {
  EXPECT_THAT(LookUpGroup("root"), common::testing::IsOkAndHolds(0u));
  EXPECT_THAT(LookUpGroup("0"), common::testing::IsOkAndHolds(0u));
  EXPECT_EQ(Load({"--socket-group", "root"})->socket_group, "root");
  EXPECT_THAT(Load({"--socket-group", "0"}), IsOk());
  const std::pair<const char*, const char*> cases[] = {
      {"99999999999", "a gid is at most 4294967294"},
      {"99999999999999999999999", "a gid is at most 4294967294"},  // std::stoul threw here
      {"4294967295", "a gid is at most 4294967294"},                // chown's "leave it alone"
      {"4294967294", "no group has gid 4294967294"},
      {"007", "leading zeros"},
      {"no-such-group-for-tensord", "no such group"},
  };
  for (const auto& [text, reason] : cases) {
    EXPECT_THAT(Load({"--socket-group", text}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(absl::StrCat("--socket-group '", text, "': ", reason))))
        << text;
  }
  {
    ScopedEnv env("TENSORD_SOCKET_GROUP", "no-such-group-for-tensord");
    EXPECT_THAT(Load({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("environment TENSORD_SOCKET_GROUP (--socket-group) "
                                             "'no-such-group-for-tensord': no such group")));
  }
  std::string path = WriteToml("socket_group = \"99999999999\"\n");
  EXPECT_THAT(Load({"--config", path}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("config ", path, ":1: socket_group '99999999999': a gid is at most"))));
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
  EXPECT_THAT(config, StatusIs(absl::StatusCode::kInvalidArgument,
                               HasSubstr(absl::StrCat("config ", path, ":1: sockett: unknown key; the keys are socket, "))));
}

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

TEST(Config, HelpAndVersionPrintAndCancel) {
  ::testing::internal::CaptureStdout();
  EXPECT_THAT(Load({"--version"}), StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  // The version, the commit built and the memory backends (cmake/TensordBuildInfo.cmake).
  EXPECT_THAT(::testing::internal::GetCapturedStdout(),
              ::testing::MatchesRegex("tensord [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit ([0-9a-f]+(-dirty)?|unknown); "
                                      "memory backends: host(, cuda)?(, level_zero)?\\)\n"));

  ScopedEnv socket("TENSORD_SOCKET", "/srv/tensord-help-test.sock");
  ::testing::internal::CaptureStdout();
  EXPECT_THAT(Load({"--help"}), StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  EXPECT_THAT(::testing::internal::GetCapturedStdout(),
              AllOf(HasSubstr("--version"), HasSubstr(absl::StrCat("for uid ", ::geteuid(),
                                                                   ": /srv/tensord-help-test.sock"))));
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

TEST(Config, MetricsAddressComesFromFlagsEnvironmentAndFileAndBadOnesNameTheirSource) {
  auto off = Load({});
  ASSERT_THAT(off, IsOk());
  EXPECT_EQ(off->metrics_address, "");
  auto flag = Load({"--metrics-address", "127.0.0.1:9464"});
  ASSERT_THAT(flag, IsOk());
  EXPECT_EQ(flag->metrics_address, "127.0.0.1:9464");
  EXPECT_THAT(Load({"--metrics-address", "9464"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--metrics-address '9464': expected HOST:PORT")));
  {
    ScopedEnv env("TENSORD_METRICS_ADDRESS", "unix:");
    EXPECT_THAT(Load({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("environment TENSORD_METRICS_ADDRESS (--metrics-address) 'unix:'")));
  }
  std::string good = WriteToml("log_level = \"info\"\nmetrics_address = \"unix:/run/tensord/metrics.sock\"\n");
  auto file = Load({"--config", good});
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ(file->metrics_address, "unix:/run/tensord/metrics.sock");
  std::string bad = WriteToml("log_level = \"info\"\nmetrics_address = \"[::1]:99999\"\n");
  EXPECT_THAT(Load({"--config", bad}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad + ":2")));
  EXPECT_THAT(PrintedConfig(*flag), HasSubstr("metrics_address = \"127.0.0.1:9464\"  # --metrics-address"));
}

}  // namespace
}  // namespace tensord::server
