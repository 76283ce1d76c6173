// tensord: the daemon. See DESIGN.md and `tensord --help`.
#include <cstdio>

#include "server/config.h"
#include "server/daemon.h"

int main(int argc, char** argv) {
  // Before any thread exists, so every thread inherits the mask and only sigwait sees them.
  tensord::server::BlockTerminationSignals();
  absl::StatusOr<tensord::server::Config> config = tensord::server::LoadConfig(argc, argv);
  if (!config.ok()) {
    if (config.status().code() == absl::StatusCode::kCancelled) return 0;  // --help
    std::fprintf(stderr, "tensord: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  absl::Status status = tensord::server::RunDaemon(*config);
  if (!status.ok()) {
    std::fprintf(stderr, "tensord: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
