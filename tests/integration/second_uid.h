// Helpers for tests that act as a second uid against the real daemon: RunAs forks a child
// that becomes another uid and reports what it saw as "check <label> <value>" lines, Wire
// speaks the protocol (a raw fd-channel session and the generated gRPC stub) from such a
// child, and RunProgramAs is the `--as UID GID [--env N=V]... -- PROGRAM ARGS...` mode of a
// test binary that starts a program (the daemon, the test peer) as that uid.
//
// A child never inherits a live gRPC from the test process: the test itself speaks gRPC only
// inside such children. Becoming another uid needs root; tests skip otherwise.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "common/memory/host/memfd.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tensord/v1/broker.grpc.pb.h"
#include "tests/integration/raw_wire.h"

namespace tensord::testing {

inline constexpr uid_t kNobody = 65534;
inline constexpr gid_t kNogroup = 65534;
inline constexpr uid_t kStranger = 65533;  // a uid and gid no ACL names

inline std::string SelfExe() {
  char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : std::string();
}

inline bool BecomeUser(uid_t uid, gid_t gid) {
  return setgroups(0, nullptr) == 0 && setresgid(gid, gid, gid) == 0 && setresuid(uid, uid, uid) == 0;
}

// ---------------------------------------------------------------------------------------
// Children that run as another uid

class Reporter {
 public:
  explicit Reporter(int fd) : fd_(fd) {}
  void Check(const std::string& label, const std::string& value) {
    std::string line = "check " + label + " " + value + "\n";
    if (write(fd_, line.data(), line.size()) < 0) _exit(3);
  }
  void Check(const std::string& label, const grpc::Status& status) { Check(label, CodeName(status.error_code())); }

 private:
  int fd_;
};

using Checks = std::map<std::string, std::string>;

// Runs `body` in a forked child as uid:gid (no supplementary groups) and returns its checks.
inline Checks RunAs(uid_t uid, gid_t gid, const std::function<void(Reporter&)>& body) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Reporter reporter(fds[1]);
    if (!BecomeUser(uid, gid)) {
      reporter.Check("become", std::strerror(errno));
      _exit(2);
    }
    body(reporter);
    _exit(0);
  }
  close(fds[1]);
  std::string output;
  char chunk[4096];
  ssize_t n;
  while ((n = read(fds[0], chunk, sizeof(chunk))) > 0) output.append(chunk, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child as uid " << uid << " failed: " << output;
  Checks checks;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("check ", 0) != 0) continue;
    size_t space = line.find(' ', 6);
    checks[line.substr(6, space - 6)] = space == std::string::npos ? "" : line.substr(space + 1);
  }
  return checks;
}

// The wire protocol spoken by a child: a session on the fd channel and gRPC calls with
// its token (or another one, to see what a stolen token is worth).
class Wire {
 public:
  explicit Wire(const std::string& socket)
      : session_(OpenSession(socket)),
        stub_(v1::Broker::NewStub(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()))),
        token_(session_.token()) {}

  void UseToken(std::string token) { token_ = std::move(token); }
  const std::string& own_token() const { return session_.token(); }
  v1::Broker::Stub& stub() { return *stub_; }
  int fd_channel() const { return session_.fd.get(); }

  void Prepare(grpc::ClientContext& context) {
    context.AddMetadata(kTokenKey, token_);
    context.set_deadline(std::chrono::system_clock::now() + 10s);
  }

  grpc::Status Acquire(v1::AcquireRequest request, v1::AcquireResponse* response) {
    grpc::ClientContext context;
    Prepare(context);
    return stub_->Acquire(&context, request, response);
  }
  grpc::Status AcquireName(const std::string& name, v1::AcquireResponse* response = nullptr) {
    v1::AcquireRequest request;
    request.set_name(name);
    v1::AcquireResponse ignored;
    return Acquire(request, response != nullptr ? response : &ignored);
  }
  grpc::Status Allocate(const std::string& ns, int64_t count, v1::AllocateResponse* response) {
    v1::AllocateRequest request;
    request.set_ns(ns);
    *request.mutable_desc() = Float32({count});
    return Allocate(request, response);
  }
  grpc::Status Allocate(const v1::AllocateRequest& request, v1::AllocateResponse* response) {
    grpc::ClientContext context;
    Prepare(context);
    return stub_->Allocate(&context, request, response);
  }
  grpc::Status Publish(uint64_t tensor_id, const std::string& name) {
    v1::PublishRequest request;
    request.set_tensor_id(tensor_id);
    request.set_name(name);
    v1::PublishResponse response;
    grpc::ClientContext context;
    Prepare(context);
    return stub_->Publish(&context, request, &response);
  }
  grpc::Status Delete(const std::string& name) {
    v1::DeleteRequest request;
    request.set_name(name);
    v1::DeleteResponse response;
    grpc::ClientContext context;
    Prepare(context);
    return stub_->Delete(&context, request, &response);
  }
  grpc::Status Take(const std::string& name) {
    v1::TakeRequest request;
    request.set_name_or_prefix(name);
    v1::AcquireResponse response;
    grpc::ClientContext context;
    Prepare(context);
    return stub_->Take(&context, request, &response);
  }
  grpc::Status Stat(v1::StatRequest request, v1::StatResponse* response) {
    grpc::ClientContext context;
    Prepare(context);
    return stub_->Stat(&context, request, response);
  }
  grpc::Status Release(uint64_t lease, v1::ReleaseResponse* response) {
    v1::ReleaseRequest request;
    request.add_lease_ids(lease);
    grpc::ClientContext context;
    Prepare(context);
    return stub_->Release(&context, request, response);
  }
  grpc::Status Status(v1::StatusResponse* response) {
    grpc::ClientContext context;
    Prepare(context);
    return stub_->Status(&context, v1::StatusRequest(), response);
  }
  // Names List shows, joined by ','.
  std::string List(const std::string& prefix) {
    v1::ListRequest request;
    request.set_prefix(prefix);
    v1::ListResponse response;
    grpc::ClientContext context;
    Prepare(context);
    if (!stub_->List(&context, request, &response).ok()) return "error";
    std::string names;
    for (const auto& tensor : response.tensors()) names += (names.empty() ? "" : ",") + tensor.name();
    return names;
  }
  // Names a Watch's initial snapshot shows, joined by ','. A Watch never ends by itself:
  // what arrives within 2 s (time for a sanitized daemon on a loaded machine) is read.
  std::string WatchSnapshot(const std::string& prefix) {
    v1::WatchRequest request;
    request.set_prefix(prefix);
    request.set_initial(true);
    grpc::ClientContext context;
    context.AddMetadata(kTokenKey, token_);
    context.set_deadline(std::chrono::system_clock::now() + 2s);
    auto reader = stub_->Watch(&context, request);
    std::string names;
    v1::WatchEvent event;
    while (reader->Read(&event)) names += (names.empty() ? "" : ",") + event.name();
    return names;
  }
  // The fd of a buffer this session holds, or why not.
  grpc::StatusCode Fetch(uint64_t buffer_id, common::UniqueFd* fd) {
    v1::FdRequest request;
    request.set_seq(++seq_);
    request.mutable_fetch()->add_buffer_ids(buffer_id);
    if (!SendRaw(session_.fd.get(), Bytes(request))) return grpc::StatusCode::UNAVAILABLE;
    FdReply reply = Receive(session_.fd.get());
    if (reply.kind != FdReply::kMessage) return grpc::StatusCode::UNAVAILABLE;
    if (reply.response.has_error()) return static_cast<grpc::StatusCode>(reply.response.error().code());
    if (reply.fds.size() != 1) return grpc::StatusCode::INTERNAL;
    *fd = std::move(reply.fds[0]);
    return grpc::StatusCode::OK;
  }
  // Allocates float32[count] in `ns`, fills it with `value`, seals it and publishes it.
  grpc::Status PublishFilled(const std::string& name, int64_t count, float value) {
    v1::AllocateResponse allocated;
    grpc::Status status = Allocate(name.substr(0, name.find('/')), count, &allocated);
    if (!status.ok()) return status;
    common::UniqueFd fd;
    if (Fetch(allocated.tensor().buffer().buffer_id(), &fd) != grpc::StatusCode::OK) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "fetch");
    }
    size_t bytes = static_cast<size_t>(count) * sizeof(float);
    void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (map == MAP_FAILED) return grpc::Status(grpc::StatusCode::INTERNAL, "mmap");
    for (int64_t i = 0; i < count; ++i) static_cast<float*>(map)[i] = value;
    munmap(map, bytes);
    if (!common::SealFutureWrite(fd.get(), "test").ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "seal");
    return Publish(allocated.tensor().tensor_id(), name);
  }

 private:
  RawSession session_;
  std::unique_ptr<v1::Broker::Stub> stub_;
  std::string token_;
  uint64_t seq_ = 100;
};

// A stream connection to the gRPC socket: its fd, or -1 with errno set.
inline int ConnectStream(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

inline std::string ErrnoName(int err) {
  switch (err) {
    case 0: return "OK";
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case EINVAL: return "EINVAL";
    case EBUSY: return "EBUSY";
    default: return "errno" + std::to_string(err);
  }
}


// `<test> --as UID GID [--env NAME=VALUE]... -- PROGRAM ARGS...`
inline int RunProgramAs(int argc, char** argv) {
  if (argc < 6) return 2;
  uid_t uid = static_cast<uid_t>(std::stoul(argv[2]));
  gid_t gid = static_cast<gid_t>(std::stoul(argv[3]));
  int i = 4;
  unsetenv("TENSORD_SOCKET");
  for (; i + 1 < argc && std::string(argv[i]) == "--env"; i += 2) {
    std::string entry = argv[i + 1];
    size_t equals = entry.find('=');
    if (equals != std::string::npos) setenv(entry.substr(0, equals).c_str(), entry.substr(equals + 1).c_str(), 1);
  }
  if (i >= argc || std::string(argv[i]) != "--") return 2;
  dup2(STDOUT_FILENO, STDERR_FILENO);
  if (!BecomeUser(uid, gid)) {
    std::printf("exec-failed cannot become uid %u: %s\n", uid, std::strerror(errno));
    return 126;
  }
  execv(argv[i + 1], argv + i + 1);
  std::printf("exec-failed %s: %s\n", argv[i + 1], std::strerror(errno));
  std::fflush(stdout);
  return 126;
}

}  // namespace tensord::testing
