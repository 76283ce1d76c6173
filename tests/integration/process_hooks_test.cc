// What libtensord.so does to the process that loads it (client.h): GRPC_POLL_STRATEGY and
// GRPC_ENABLE_FORK_SUPPORT set at load time, fork handlers installed at the first connect;
// and the TENSORD_NO_PROCESS_HOOKS=1 opt-out, which leaves both alone. The variables are
// read at load time, so each case runs this binary again as a probe, under env(1), in an
// environment with no GRPC_* or TENSORD_NO_PROCESS_HOOKS of its own.
//
// Has its own main(): `process_hooks_test --probe SOCKET` prints what the library left in
// its environment, connects, forks, and has the child say how many fd-channel sockets it
// holds (the child's fork handler closes the inherited one) and, when the handlers ran,
// whether the child's own session works.
#include <dirent.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/gtest_run.h"
#include "tests/integration/daemon_fixture.h"

namespace tensord {
namespace {

using testing::DaemonProcess;
using testing::RunToEnd;

// Connected SOCK_SEQPACKET sockets among our fds: the client's fd channel.
int CountFdChannels() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    const int fd = std::atoi(entry->d_name);
    if (entry->d_name[0] == '.' || fd == dirfd(dir)) continue;
    int type = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_SEQPACKET) ++count;
  }
  closedir(dir);
  return count;
}

// One line on stdout, unbuffered: a fork must not copy a half-written stdio buffer.
void Say(const std::string& line) {
  const std::string out = line + "\n";
  if (write(STDOUT_FILENO, out.data(), out.size()) != static_cast<ssize_t>(out.size())) std::_Exit(3);
}

std::string EnvOrUnset(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "unset" : value;
}

int Probe(const std::string& socket) {
  Say("poll_strategy=" + EnvOrUnset("GRPC_POLL_STRATEGY"));
  Say("fork_support=" + EnvOrUnset("GRPC_ENABLE_FORK_SUPPORT"));
  ClientOptions options;
  options.socket_path = socket;
  Result<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) {
    Say("connect=" + client.status().ToString());
    return 1;
  }
  if (Result<std::vector<TensorInfo>> listed = (*client)->List(); !listed.ok()) {
    Say("list=" + listed.status().ToString());
    return 1;
  }
  Say("parent_fd_channels=" + std::to_string(CountFdChannels()));
  pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    const int held = CountFdChannels();
    Say("child_fd_channels=" + std::to_string(held));
    // Without the handlers the child must not touch the client (client.h): it only counts.
    if (held == 0) {
      Result<std::vector<TensorInfo>> listed = (*client)->List();
      Say(std::string("child_call=") + (listed.ok() ? "ok" : listed.status().ToString()));
    }
    std::_Exit(0);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Say("child=failed");
    return 1;
  }
  Say("done");
  return 0;
}

std::string SelfPath() {
  std::vector<char> path(4096);
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  return n > 0 ? std::string(path.data(), static_cast<size_t>(n)) : std::string();
}

// The probe's stdout lines joined by '|', run with `assignments` (NAME=VALUE) on top of an
// environment without the variables under test.
std::string RunProbe(const DaemonProcess& daemon, const std::vector<std::string>& assignments) {
  std::vector<std::string> argv = {"/usr/bin/env", "-u", "GRPC_POLL_STRATEGY", "-u", "GRPC_ENABLE_FORK_SUPPORT",
                                   "-u", "TENSORD_NO_PROCESS_HOOKS"};
  argv.insert(argv.end(), assignments.begin(), assignments.end());
  argv.insert(argv.end(), {SelfPath(), "--probe", daemon.socket()});
  return RunToEnd(argv);
}

TEST(ProcessHooks, ByDefaultTheLibrarySetsGrpcForForkAndHandlesFork) {
  DaemonProcess daemon;
  const std::string out = RunProbe(daemon, {});
  EXPECT_EQ(out,
            "poll_strategy=poll|fork_support=1|parent_fd_channels=1|child_fd_channels=0|child_call=ok|done");
}

TEST(ProcessHooks, AProgramsOwnSettingWins) {
  DaemonProcess daemon;
  const std::string out = RunProbe(daemon, {"GRPC_ENABLE_FORK_SUPPORT=0"});
  EXPECT_EQ(out.rfind("poll_strategy=poll|fork_support=0|", 0), 0u) << out;
}

TEST(ProcessHooks, TensordNoProcessHooksLeavesTheEnvironmentAndForkAlone) {
  DaemonProcess daemon;
  const std::string out = RunProbe(daemon, {"TENSORD_NO_PROCESS_HOOKS=1"});
  // No handler closed the inherited fd channel: the child holds the parent's connection.
  EXPECT_EQ(out, "poll_strategy=unset|fork_support=unset|parent_fd_channels=1|child_fd_channels=1|done");
}

TEST(ProcessHooks, OnlyOneOptsOut) {
  DaemonProcess daemon;
  const std::string out = RunProbe(daemon, {"TENSORD_NO_PROCESS_HOOKS=0"});
  EXPECT_EQ(out.rfind("poll_strategy=poll|fork_support=1|", 0), 0u) << out;
}

}  // namespace
}  // namespace tensord

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--probe") return tensord::Probe(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  return tensord::testing::RunAllTestsReportingSkips();
}
