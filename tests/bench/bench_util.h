// Helpers shared by the tensord benchmark programs: RAII for fds, mappings, temporary
// directories and child processes, and a latency sample set with percentiles that it
// reports as Google Benchmark counters.
//
// Child processes are started with posix_spawn, not fork(): the benchmark process holds
// tensord clients, and a fork() would make them drop and rebuild their gRPC state
// (pthread_atfork), which would show up in the figures. Children stay in the benchmark's
// process group, so a Ctrl-C (or a driver killing the group) reaches them too, and the
// Process destructor kills and reaps its child, so nothing a benchmark started outlives
// it; Die() kills every child still running before it exits.
//
// Not thread-safe; each object belongs to one benchmark thread.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"

extern char** environ;

namespace tensord::bench {

using Clock = std::chrono::steady_clock;

// The children started by Process that have not been reaped yet.
inline std::vector<pid_t>& LiveChildren() {
  static std::vector<pid_t> children;
  return children;
}

// The TempDirs that exist now.
inline std::vector<std::string>& LiveTempDirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

// Prints what failed, kills the children, removes the temporary directories and exits: a
// benchmark that cannot do its work must not report figures.
[[noreturn]] inline void Die(const std::string& what) {
  std::fprintf(stderr, "tensord_bench: %s\n", what.c_str());
  std::fflush(stderr);
  for (pid_t child : LiveChildren()) ::kill(child, SIGKILL);
  for (const std::string& dir : LiveTempDirs()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  std::_Exit(1);
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) Reset(std::exchange(other.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

class Mapping {
 public:
  Mapping(int fd, size_t size, int prot, int flags) : size_(size) {
    void* data = ::mmap(nullptr, size, prot, flags, fd, 0);
    if (data == MAP_FAILED) Die("mmap: " + std::string(strerror(errno)));
    data_ = static_cast<uint8_t*>(data);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { ::munmap(data_, size_); }
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A private directory under $TMPDIR, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tensord-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) Die("mkdtemp: " + std::string(strerror(errno)));
    path_ = pattern;
    LiveTempDirs().push_back(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
    auto& dirs = LiveTempDirs();
    dirs.erase(std::remove(dirs.begin(), dirs.end(), path_), dirs.end());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child program with its stdout on a pipe.
class Process {
 public:
  explicit Process(const std::vector<std::string>& argv) {
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) Die("pipe2: " + std::string(strerror(errno)));
    Fd read_end(pipe_fds[0]);
    Fd write_end(pipe_fds[1]);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) Die("spawn " + argv[0] + ": " + strerror(rc));
    LiveChildren().push_back(pid_);
    out_ = std::move(read_end);
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }

  // Reads stdout until a line that starts with `prefix` and returns it; dies on timeout
  // or end of file (the child failed to start).
  std::string WaitForLine(const std::string& prefix, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      size_t newline;
      while ((newline = buffer_.find('\n')) != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        if (line.rfind(prefix, 0) == 0) return line;
        said_ += line + "\n";
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        Die("timed out waiting for '" + prefix + "' from child " + std::to_string(pid_) + "; it said: " + said_);
      }
      pollfd waiting{out_.get(), POLLIN, 0};
      if (::poll(&waiting, 1, static_cast<int>(std::min<int64_t>(left.count(), 100))) <= 0) continue;
      char chunk[4096];
      ssize_t n = ::read(out_.get(), chunk, sizeof(chunk));
      if (n == 0) {
        Die("child " + std::to_string(pid_) + " exited before saying '" + prefix + "'; it said: " + said_ + buffer_);
      }
      if (n > 0) buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
  void Signal(int signal) const {
    if (pid_ > 0) ::kill(pid_, signal);
  }
  // Whether the child has exited within `timeout` (then it is reaped and *status set).
  bool WaitFor(std::chrono::milliseconds timeout, int* status) {
    const auto deadline = Clock::now() + timeout;
    while (pid_ > 0) {
      pid_t done = waitpid(pid_, status, WNOHANG);
      if (done == pid_) {
        Forget();
        return true;
      }
      if (Clock::now() > deadline) return false;
      usleep(1000);
    }
    return true;
  }
  // Reaps the child; returns its wait status.
  int Wait() {
    int status = 0;
    if (pid_ > 0) {
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
    Forget();
    return status;
  }
  pid_t pid() const { return pid_; }

 private:
  void Forget() {
    auto& children = LiveChildren();
    children.erase(std::remove(children.begin(), children.end(), pid_), children.end());
    pid_ = -1;
  }
  pid_t pid_ = -1;
  Fd out_;
  std::string buffer_;
  std::string said_;  // lines read so far that did not match, for error messages
};

// Iteration counts: the full run, or a smoke run (--quick) that only checks that every
// benchmark works.
struct Scale {
  bool quick = false;
  int64_t Pick(int64_t full, int64_t smoke) const { return quick ? smoke : full; }
};

// This program's own path, for re-running it as a helper server.
inline std::string SelfPath() {
  std::error_code error;
  auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) Die("readlink /proc/self/exe: " + error.message());
  return path.string();
}

// Latency samples of one benchmark; Report() sets p50/p99 counters in microseconds.
class Samples {
 public:
  explicit Samples(size_t expected) { values_.reserve(expected); }
  void Add(Clock::duration d) { values_.push_back(std::chrono::duration<double, std::micro>(d).count()); }
  double Percentile(double p) {
    if (values_.empty()) return 0;
    std::sort(values_.begin(), values_.end());
    size_t index = static_cast<size_t>(p * static_cast<double>(values_.size() - 1) + 0.5);
    return values_[std::min(index, values_.size() - 1)];
  }
  void Report(benchmark::State& state) {
    state.counters["p50_us"] = Percentile(0.50);
    state.counters["p99_us"] = Percentile(0.99);
    state.counters["samples"] = static_cast<double>(values_.size());
  }

 private:
  std::vector<double> values_;
};

// Times one iteration's work for both the manual-time mean and the percentiles.
template <typename Work>
void TimeIteration(benchmark::State& state, Samples& samples, Work&& work) {
  const auto start = Clock::now();
  work();
  const auto elapsed = Clock::now() - start;
  samples.Add(elapsed);
  state.SetIterationTime(std::chrono::duration<double>(elapsed).count());
}

}  // namespace tensord::bench
