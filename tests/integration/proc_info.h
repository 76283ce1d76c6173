// A look at a process from outside, through /proc: for tests and benchmarks that watch the
// daemon. No dependencies beyond the standard library.
#pragma once

#include <dirent.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

namespace tensord::testing {

// A field of /proc/<pid>/status or /proc/<pid>/limits, by the start of its line ("" if absent).
inline std::string ProcLine(pid_t pid, const std::string& file, const std::string& prefix) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  }
  return "";
}

// VmRSS in KiB, or -1 when it cannot be read.
inline int64_t RssKiB(pid_t pid) {
  std::istringstream in(ProcLine(pid, "status", "VmRSS:"));
  int64_t kib = -1;
  in >> kib;
  return kib;
}

// Open fds of a process (-1 when /proc cannot be read).
inline int CountFds(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

// What `measure()` reads once it has held still: five equal readings 50 ms apart (250 ms).
// Take a baseline with this, not one reading: a connection closed just before (the
// fixture's readiness probe, a set-up client) may not be closed on the daemon's side yet.
// Past `deadline` (10 s) it returns the last reading, for the caller's check to report.
template <typename Measure>
auto HeldStill(Measure measure, std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
  const auto give_up = std::chrono::steady_clock::now() + deadline;
  auto last = measure();
  for (int unchanged = 0; unchanged < 5 && std::chrono::steady_clock::now() < give_up;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto now = measure();
    unchanged = now == last ? unchanged + 1 : 0;
    last = std::move(now);
  }
  return last;
}

// The fd count once it has held still (HeldStill).
inline int StableFdCount(pid_t pid) {
  return HeldStill([pid] { return CountFds(pid); });
}

// What each open fd points at ("4 socket:[1234]", "9 /memfd:stray (deleted)"), one per
// line: a failed fd count shows which fd it was.
inline std::string FdTargets(pid_t pid) {
  const std::string dir_path = "/proc/" + std::to_string(pid) + "/fd";
  std::string out;
  DIR* dir = opendir(dir_path.c_str());
  if (dir == nullptr) return dir_path + ": " + std::strerror(errno);
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    char target[256];
    const ssize_t n = readlink((dir_path + "/" + entry->d_name).c_str(), target, sizeof(target) - 1);
    out += std::string(entry->d_name) + " " + (n < 0 ? std::string("?") : std::string(target, n)) + "\n";
  }
  closedir(dir);
  return out;
}

// Waits up to 5 s for the daemon's fd count to come back to `expected`.
inline int SettledFdCount(pid_t pid, int expected) {
  int count = CountFds(pid);
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
       count != expected && std::chrono::steady_clock::now() < deadline; count = CountFds(pid)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return count;
}

}  // namespace tensord::testing
