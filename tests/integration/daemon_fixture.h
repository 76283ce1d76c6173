// DaemonProcess: starts the real `tensord` binary on a private socket for one test and
// stops it with SIGTERM (checking that it exits 0). PeerProcess: runs tensord_test_peer
// with a pipe on its stdout so a test can wait for "ready" lines and kill it with -9.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tensord::testing {

inline std::string MakeTempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "tensord-test-XXXXXX").string();
  char* dir = mkdtemp(pattern.data());
  return dir == nullptr ? std::string() : std::string(dir);
}

// Runs argv with stdout on a pipe; the child gets its own process group.
class ChildProcess {
 public:
  ChildProcess() = default;
  explicit ChildProcess(const std::vector<std::string>& argv) { Start(argv); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Kill(SIGKILL); }

  void Start(const std::vector<std::string>& argv) {
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(pipe_fds[1], STDOUT_FILENO);
      std::vector<char*> args;
      for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(pipe_fds[1]);
    out_fd_ = pipe_fds[0];
  }

  // Reads stdout until a line starting with `prefix` (returned whole) or the timeout.
  std::string WaitForLine(const std::string& prefix, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      size_t newline;
      while ((newline = buffer_.find('\n')) != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        if (line.rfind(prefix, 0) == 0) return line;
      }
      if (!pollfd_wait(50)) continue;  // nothing to read yet: never block in read()
      char chunk[4096];
      ssize_t n = read(out_fd_, chunk, sizeof(chunk));
      if (n > 0) buffer_.append(chunk, static_cast<size_t>(n));
      if (n == 0) break;
    }
    return "";
  }

  // Sends a signal and reaps; returns the wait status (or -1).
  int Kill(int signal) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, signal);
    return Wait();
  }
  int Wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (out_fd_ >= 0) close(out_fd_);
    out_fd_ = -1;
    return status;
  }
  pid_t pid() const { return pid_; }

 private:
  // Whether stdout has something to read (or hit end of file) within `ms`.
  bool pollfd_wait(int ms) {
    fd_set set;
    FD_ZERO(&set);
    FD_SET(out_fd_, &set);
    timeval tv{0, ms * 1000};
    return select(out_fd_ + 1, &set, nullptr, nullptr, &tv) > 0;
  }
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buffer_;
};

inline bool Accepts(const std::string& seqpacket_path) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (seqpacket_path.size() >= sizeof(address.sun_path)) {
    close(fd);
    return false;
  }
  std::memcpy(address.sun_path, seqpacket_path.c_str(), seqpacket_path.size() + 1);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return ok;
}

class DaemonProcess {
 public:
  explicit DaemonProcess(std::vector<std::string> extra_args = {})
      : extra_args_(std::move(extra_args)) {
    dir_ = MakeTempDir();
    socket_ = dir_ + "/tensord.sock";
    Start();
  }
  // Starts the daemon (again, after Kill) on the same socket, and waits for it to serve.
  void Start() {
    std::vector<std::string> argv = {TENSORD_BIN, "--socket", socket_, "--log-level", "warn"};
    argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
    process_.Start(argv);
    // Serving means both sockets exist and the fd channel accepts (a killed daemon may
    // have left stale socket files behind: the new one must replace them). A sanitized
    // daemon on a loaded machine can take seconds to start.
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
         std::chrono::steady_clock::now() < deadline;) {
      struct stat info{};
      if (stat(socket_.c_str(), &info) == 0 && Accepts(socket_ + ".fd")) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "tensord did not start serving on " << socket_ << " within 30 s";
  }
  // Sends `signal` and reaps; returns the wait status.
  int Kill(int signal) { return process_.Kill(signal); }
  ~DaemonProcess() {
    if (process_.pid() > 0) Stop();
    std::filesystem::remove_all(dir_);
  }
  // SIGTERM; returns the exit status.
  int Stop() { return process_.Kill(SIGTERM); }
  pid_t pid() const { return process_.pid(); }
  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }

 private:
  std::vector<std::string> extra_args_;
  std::string dir_;
  std::string socket_;
  ChildProcess process_;
};

// Runs `argv` to its end and returns its stdout lines joined by '|'.
inline std::string RunToEnd(const std::vector<std::string>& argv) {
  ChildProcess child(argv);
  std::string out;
  for (std::string line = child.WaitForLine(""); !line.empty(); line = child.WaitForLine("")) {
    out += (out.empty() ? "" : "|") + line;
  }
  child.Wait();
  return out;
}

inline std::vector<std::string> PeerArgs(std::initializer_list<std::string> args) {
  std::vector<std::string> argv = {TENSORD_TEST_PEER};
  argv.insert(argv.end(), args);
  return argv;
}

}  // namespace tensord::testing
