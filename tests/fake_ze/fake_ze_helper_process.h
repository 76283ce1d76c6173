// The helper processes of the fake_ze tests. The loader initialises once per process, so
// whatever needs another environment, or another process, runs in a helper: this binary
// again (fork + exec), told its role by TENSORD_FAKE_ZE_TEST_ROLE; the role runs before
// main() and reports back over a socketpair. fake_ze_helper_process.cc holds the roles and
// sets the environment that the test and every helper run with (before main()).
#pragma once

#include <sys/types.h>
#include <sys/wait.h>

#include <csignal>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/fake_ze/fake_ze_loader_api.h"

namespace tensord::fake_ze_test {

// ---- The parent's side of a helper --------------------------------------------------------

struct Helper {
  pid_t pid = -1;
  UniqueFd sock;

  Helper() = default;
  Helper(Helper&& other) noexcept
      : pid(std::exchange(other.pid, -1)), sock(std::move(other.sock)) {}

  // The exit code, or -1 if it did not exit by itself.
  int Wait() {
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Helper() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

// This binary again in `role`, with `env` ("NAME=value") over the test's environment and
// the other end of a SOCK_SEQPACKET socketpair. The driver's memfds are MFD_CLOEXEC: the
// helper gets an fd only if one is sent to it.
Helper Spawn(const std::string& role, const std::vector<std::string>& env);

// A probe helper's report under `env`.
std::map<std::string, std::string> Probe(const std::vector<std::string>& env, int* exit_code);

}  // namespace tensord::fake_ze_test
