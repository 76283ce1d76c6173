#include "client/cli/command_support.h"

#include <signal.h>

#include <atomic>
#include <cstdio>

namespace tensord::cli {
namespace {

std::atomic<bool> interrupted{false};

void OnStopSignal(int) { interrupted.store(true); }

}  // namespace

int Fail(const std::string& what, const std::string& message, int exit_code) {
  std::string line = "tensorctl: " + what + ": " + message;
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  return exit_code;
}

int Fail(const std::string& what, const Status& status) {
  return Fail(what, status.message().empty() ? std::string(StatusCodeName(status.code()))
                                             : status.message());
}

Result<std::unique_ptr<Client>> ConnectFromFlags(const GlobalFlags& flags) {
  ClientOptions options;
  options.socket_path = flags.socket;
  options.trusted_daemon_uids = flags.trusted_daemon_uids;
  options.client_name = "tensorctl";
  options.lease_cache = false;
  return Client::Connect(options);
}

void EndOnSignal() {
  struct sigaction sa {};
  sa.sa_handler = &OnStopSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
}

bool Interrupted() { return interrupted.load(); }

}  // namespace tensord::cli
