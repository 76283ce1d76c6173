// The daemon's configuration from flags, the environment and a TOML file: sizes and counts,
// values of the wrong type, which source wins, --print-config, ACLs, the socket group,
// unknown keys, --help and --version, the metrics address; and errors that name the flag,
// the variable or the file key.
#include "server/daemon/config.h"

#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"
#include "tests/unit/server/config_fixture.h"

namespace tensord::server {
namespace {

using common::testing::IsOk;
using common::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Load;
using testing::ScopedEnv;
using testing::WriteToml;

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
