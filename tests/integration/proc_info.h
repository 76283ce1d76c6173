// A look at a process from outside, through /proc: for tests and benchmarks that watch the
// daemon. No dependencies beyond the standard library.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

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

}  // namespace tensord::testing
