// tensord: the daemon. See DESIGN.md and `tensord --help`.
#include <cstdio>

#include "absl/synchronization/mutex.h"
#include "server/daemon/config.h"
#include "server/daemon/daemon.h"

int main(int argc, char** argv) {
  // Before any thread exists, so every thread inherits the mask and only sigwait sees them.
  tensord::server::BlockTerminationSignals();
#ifdef NDEBUG
  // Debian's abseil checks every Mutex acquisition for lock-order cycles, a debugging aid
  // that cost about 5% of the daemon's CPU on the hot path. Debug builds keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  absl::StatusOr<tensord::server::Config> config = tensord::server::LoadConfig(argc, argv);
  if (!config.ok()) {
    if (config.status().code() == absl::StatusCode::kCancelled) return 0;  // --help, --version
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
