// Helpers for the configuration's tests (server/daemon/config.h): load a configuration from a
// command line, the environment and TOML files written for the test, and set environment
// variables for one scope.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon/config.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::server::testing {

// LoadConfig(tensord <args>).
inline absl::StatusOr<Config> Load(std::vector<std::string> args) {
  std::string name = "tensord";
  std::vector<char*> argv = {name.data()};
  for (std::string& arg : args) argv.push_back(arg.data());
  return LoadConfig(static_cast<int>(argv.size()), argv.data());
}

// Writes `contents` to a TOML file named after the running test (and `suffix`) and returns
// its path.
inline std::string WriteToml(const std::string& contents, const std::string& suffix = "") {
  std::string path = absl::StrCat(::testing::TempDir(), "/tensord_",
                                  ::testing::UnitTest::GetInstance()->current_test_info()->name(), suffix, ".toml");
  std::ofstream(path) << contents;
  return path;
}

// `field` of a configuration that must have loaded.
inline uint64_t Field(const absl::StatusOr<Config>& config, uint64_t Config::*field) {
  EXPECT_THAT(config, common::testing::IsOk());
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

}  // namespace tensord::server::testing
