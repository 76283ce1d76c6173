// Access control against the real `tensord`, with a second uid: per-namespace ACLs from the
// configuration (uid and gid lists), identity only from SO_PEERCRED, session tokens bound to
// the credentials that opened them, reader views that cannot change what others see (the
// memfd's seals), socket and directory modes, and clients that refuse a daemon running as
// an unexpected uid.
//
// Needs root (to become uid 65534 and 65533); skipped otherwise. Work as another uid runs
// in a child forked from this process, which never uses gRPC itself, so each child starts
// gRPC afresh; a child reports what it saw as "check <label> <value>" lines on a pipe and
// the test asserts on them. `acl_test --as UID GID [--env N=V]... -- PROGRAM ARGS...` runs
// a program (the daemon, the test peer) as that uid.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/memory/host/memfd.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tensord/v1/broker.grpc.pb.h"
#include "tests/gtest_run.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/raw_wire.h"
#include "tests/integration/second_uid.h"

namespace tensord {
namespace {

using namespace testing;  // tensord::testing: the daemon fixture and the raw wire helpers

// ---------------------------------------------------------------------------------------
// The daemon as root, with an ACL configuration

class AclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as uid " << kNobody << " and " << kStranger;
    config_ = MakeTempDir() + ".toml";
    std::ofstream file(config_);
    file << "[acl.shared]\nread_uids = [" << kNobody << "]\n"
         << "[acl.team]\nread_gids = [" << kNogroup << "]\nwrite_gids = [" << kNogroup << "]\n";
    file.close();
    // The group by name where it has one (exercising the lookup), else by number.
    group* entry = getgrgid(kNogroup);
    std::string group_name = entry != nullptr ? entry->gr_name : std::to_string(kNogroup);
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{"--config", config_, "--socket-group", group_name});
    // Others may traverse the directory; the sockets' own mode and group decide who connects.
    chmod(daemon_->dir().c_str(), 0711);
    socket_ = daemon_->socket();
    Produce("shared/x", 1024, 2.5f);
    Produce("private/x", 1024, 7.0f);
    Produce("team/base", 16, 1.0f);
  }
  void TearDown() override {
    daemon_.reset();
    if (!config_.empty()) {
      std::filesystem::remove(config_);
      std::filesystem::remove(config_.substr(0, config_.size() - 5));
    }
  }

  // Published by root through the public client (another process).
  void Produce(const std::string& name, int count, float value) {
    ChildProcess producer(PeerArgs({"produce", socket_, name, std::to_string(count), std::to_string(value)}));
    ASSERT_NE(producer.WaitForLine("published"), "") << name;
    producer.Wait();
  }

  // Ids of a tensor, looked up by root.
  std::pair<uint64_t, uint64_t> TensorAndBuffer(const std::string& name) {
    std::string socket = socket_;
    Checks ids = RunAs(0, 0, [&](Reporter& report) {
      Wire wire(socket);
      v1::StatRequest request;
      request.set_name(name);
      v1::StatResponse response;
      report.Check("stat", wire.Stat(request, &response));
      report.Check("tensor", std::to_string(response.tensor().tensor_id()));
      report.Check("buffer", std::to_string(response.tensor().buffer().buffer_id()));
    });
    EXPECT_EQ(ids["stat"], "OK");
    return {std::stoull("0" + ids["tensor"]), std::stoull("0" + ids["buffer"])};
  }

  std::string config_;
  std::string socket_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(AclTest, ASecondUidGetsExactlyWhatTheConfigurationGrants) {
  // Not a structured binding: the lambdas below capture these (clang 14 cannot).
  const auto private_ids = TensorAndBuffer("private/x");
  const uint64_t private_id = private_ids.first;
  const uint64_t private_buffer = private_ids.second;
  ASSERT_NE(private_id, 0u);
  std::string socket = socket_;
  Checks checks = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    Wire wire(socket);
    // shared: read (read_uids), nothing else.
    v1::AcquireResponse shared;
    report.Check("acquire_shared", wire.AcquireName("shared/x", &shared));
    common::UniqueFd fd;
    report.Check("fetch_shared", CodeName(wire.Fetch(shared.tensor().buffer().buffer_id(), &fd)));
    v1::AllocateResponse allocated;
    report.Check("allocate_shared", wire.Allocate("shared", 16, &allocated));
    report.Check("delete_shared", wire.Delete("shared/x"));
    report.Check("take_shared", wire.Take("shared/x"));
    v1::AllocateResponse unnamed;
    report.Check("allocate_unnamed", wire.Allocate("", 0, &unnamed));
    report.Check("publish_into_shared", wire.Publish(unnamed.tensor().tensor_id(), "shared/y"));
    report.Check("publish_into_private", wire.Publish(unnamed.tensor().tensor_id(), "private/y"));
    // private: no ACL, so nothing at all, by name or by id.
    report.Check("acquire_private", wire.AcquireName("private/x"));
    v1::StatRequest stat;
    stat.set_name("private/x");
    v1::StatResponse stat_response;
    report.Check("stat_private", wire.Stat(stat, &stat_response));
    stat.set_tensor_id(private_id);
    report.Check("stat_private_by_id", wire.Stat(stat, &stat_response));
    v1::AcquireRequest by_id;
    by_id.set_tensor_id(private_id);
    v1::AcquireResponse ignored;
    report.Check("acquire_private_by_id", wire.Acquire(by_id, &ignored));
    report.Check("fetch_private_buffer", CodeName(wire.Fetch(private_buffer, &fd)));
    report.Check("delete_private", wire.Delete("private/x"));
    report.Check("list", wire.List(""));
    report.Check("watch", wire.WatchSnapshot(""));
    // team: read and write through the group.
    report.Check("acquire_team", wire.AcquireName("team/base"));
    report.Check("publish_team", wire.PublishFilled("team/y", 16, 3.0f));
    report.Check("delete_team", wire.Delete("team/y"));
  });
  EXPECT_EQ(checks["acquire_shared"], "OK");
  EXPECT_EQ(checks["fetch_shared"], "OK");
  EXPECT_EQ(checks["allocate_shared"], "PERMISSION_DENIED");
  EXPECT_EQ(checks["delete_shared"], "PERMISSION_DENIED");
  EXPECT_EQ(checks["take_shared"], "PERMISSION_DENIED");
  EXPECT_EQ(checks["allocate_unnamed"], "OK");
  EXPECT_EQ(checks["publish_into_shared"], "PERMISSION_DENIED");
  EXPECT_EQ(checks["publish_into_private"], "PERMISSION_DENIED");
  EXPECT_EQ(checks["acquire_private"], "PERMISSION_DENIED");
  EXPECT_EQ(checks["stat_private"], "PERMISSION_DENIED");
  // An id names no namespace: a tensor out of reach is answered as no tensor at all.
  EXPECT_EQ(checks["stat_private_by_id"], "NOT_FOUND");
  EXPECT_EQ(checks["acquire_private_by_id"], "NOT_FOUND");
  EXPECT_EQ(checks["fetch_private_buffer"], "NOT_FOUND");
  EXPECT_EQ(checks["delete_private"], "PERMISSION_DENIED");
  EXPECT_EQ(checks["list"], "shared/x,team/base");
  EXPECT_EQ(checks["watch"], "shared/x,team/base");
  EXPECT_EQ(checks["acquire_team"], "OK");
  EXPECT_EQ(checks["publish_team"], "OK");
  EXPECT_EQ(checks["delete_team"], "OK");

  // A uid no ACL names sees nothing but may still use the daemon; root sees everything.
  Checks stranger = RunAs(kStranger, kNogroup, [&](Reporter& report) {
    Wire wire(socket);
    report.Check("acquire_shared", wire.AcquireName("shared/x"));
    report.Check("acquire_team", wire.AcquireName("team/base"));  // through the group
    report.Check("list", wire.List(""));
  });
  EXPECT_EQ(stranger["acquire_shared"], "PERMISSION_DENIED");
  EXPECT_EQ(stranger["acquire_team"], "OK");
  EXPECT_EQ(stranger["list"], "team/base");
  Checks root = RunAs(0, 0, [&](Reporter& report) {
    Wire wire(socket);
    report.Check("list", wire.List(""));
  });
  EXPECT_EQ(root["list"], "private/x,shared/x,team/base");
}

TEST_F(AclTest, AStolenTokenIsUselessToAnotherUid) {
  // Root's session, held by this process; its token is what a thief would have seen.
  RawSession root_session = OpenSession(socket_);
  std::string root_token = root_session.token();
  std::string socket = socket_;
  Checks owner = RunAs(0, 0, [&](Reporter& report) {
    Wire wire(socket);
    wire.UseToken(root_token);
    v1::StatusResponse status;
    report.Check("status", wire.Status(&status));
    v1::AcquireResponse acquired;
    report.Check("acquire", wire.AcquireName("shared/x", &acquired));
    report.Check("lease", std::to_string(acquired.lease_id()));
  });
  ASSERT_EQ(owner["status"], "OK") << "the token does not even work for its owner";
  ASSERT_EQ(owner["acquire"], "OK");
  uint64_t lease = std::stoull(owner["lease"]);

  Checks thief = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    Wire wire(socket);
    wire.UseToken(root_token);
    v1::StatusResponse status;
    report.Check("status", wire.Status(&status));
    report.Check("acquire_private", wire.AcquireName("private/x"));
    report.Check("delete_private", wire.Delete("private/x"));
    v1::ReleaseResponse released;
    report.Check("release_roots_lease", wire.Release(lease, &released));
    grpc::ClientContext context;
    wire.Prepare(context);
    auto stream = wire.stub().Session(&context);
    v1::SessionRequest request;
    request.set_seq(1);
    request.mutable_acquire()->set_name("private/x");
    stream->Write(request);
    stream->WritesDone();
    v1::SessionResponse response;
    while (stream->Read(&response)) {
    }
    report.Check("session_stream", stream->Finish());
    report.Check("watch", wire.WatchSnapshot("").empty() ? "nothing" : "events");
  });
  EXPECT_EQ(thief["status"], "UNAUTHENTICATED");
  EXPECT_EQ(thief["acquire_private"], "UNAUTHENTICATED");
  EXPECT_EQ(thief["delete_private"], "UNAUTHENTICATED");
  EXPECT_EQ(thief["release_roots_lease"], "UNAUTHENTICATED");
  EXPECT_EQ(thief["session_stream"], "UNAUTHENTICATED");
  EXPECT_EQ(thief["watch"], "nothing");

  // Root's lease and names are untouched.
  Checks after = RunAs(0, 0, [&](Reporter& report) {
    Wire wire(socket);
    wire.UseToken(root_token);
    v1::ReleaseResponse released;
    report.Check("release", wire.Release(lease, &released));
    report.Check("released", std::to_string(released.released()));
    report.Check("list", wire.List("private/"));
  });
  EXPECT_EQ(after["release"], "OK");
  EXPECT_EQ(after["released"], "1");
  EXPECT_EQ(after["list"], "private/x");
}

TEST_F(AclTest, AReaderCannotChangeAPublishedTensorForAnyoneElse) {
  std::string socket = socket_;
  Checks checks = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    Wire wire(socket);
    v1::AcquireResponse acquired;
    report.Check("acquire", wire.AcquireName("shared/x", &acquired));
    common::UniqueFd fd;
    report.Check("fetch", CodeName(wire.Fetch(acquired.tensor().buffer().buffer_id(), &fd)));
    size_t size = acquired.tensor().buffer().size();
    auto seals = common::GetSeals(fd.get(), "shared/x");
    int required = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE;
    report.Check("seals", seals.ok() && (*seals & required) == required ? "sealed" : "missing");
    // A shared writable mapping is what would reach other readers: refused.
    void* shared_rw = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    report.Check("mmap_shared_rw", shared_rw == MAP_FAILED ? ErrnoName(errno) : "mapped");
    float one = -1.0f;
    report.Check("pwrite", pwrite(fd.get(), &one, sizeof(one), 0) < 0 ? ErrnoName(errno) : "written");
    // Reopening the memfd read-write through /proc does not get around the seal.
    std::string proc = "/proc/self/fd/" + std::to_string(fd.get());
    common::UniqueFd reopened(open(proc.c_str(), O_RDWR | O_CLOEXEC));
    if (reopened) {
      report.Check("reopened_pwrite", pwrite(reopened.get(), &one, sizeof(one), 0) < 0 ? ErrnoName(errno) : "written");
      void* again = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, reopened.get(), 0);
      report.Check("reopened_mmap_shared_rw", again == MAP_FAILED ? ErrnoName(errno) : "mapped");
      report.Check("reopened_ftruncate", ftruncate(reopened.get(), 0) < 0 ? ErrnoName(errno) : "truncated");
    } else {
      report.Check("reopened_pwrite", ErrnoName(errno));
      report.Check("reopened_mmap_shared_rw", ErrnoName(errno));
      report.Check("reopened_ftruncate", ErrnoName(errno));
    }
    // A private copy-on-write view is the reader's own: writing it changes nothing else.
    void* cow = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0);
    if (cow != MAP_FAILED) {
      static_cast<float*>(cow)[0] = -1.0f;
      report.Check("private_view", std::to_string(static_cast<float*>(cow)[0]));
    }
    void* fresh = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
    report.Check("fresh_view", fresh == MAP_FAILED ? ErrnoName(errno) : std::to_string(static_cast<float*>(fresh)[0]));
  });
  EXPECT_EQ(checks["acquire"], "OK");
  EXPECT_EQ(checks["fetch"], "OK");
  EXPECT_EQ(checks["seals"], "sealed");
  EXPECT_EQ(checks["mmap_shared_rw"], "EPERM");
  EXPECT_EQ(checks["pwrite"], "EPERM");
  EXPECT_EQ(checks["reopened_pwrite"], "EPERM");
  EXPECT_EQ(checks["reopened_mmap_shared_rw"], "EPERM");
  EXPECT_EQ(checks["reopened_ftruncate"], "EPERM");
  EXPECT_EQ(checks["private_view"], std::to_string(-1.0f));
  EXPECT_EQ(checks["fresh_view"], std::to_string(2.5f));
  // And another reader (root, through the public client) sees the published values.
  ChildProcess reader(PeerArgs({"hold", socket_, "shared/x"}));
  EXPECT_EQ(reader.WaitForLine("held"), "held 2560.000000");
}

TEST_F(AclTest, SocketsAre0660InTheConfiguredGroupAndOthersCannotConnect) {
  for (const std::string& path : {socket_, socket_ + ".fd"}) {
    struct stat info{};
    ASSERT_EQ(stat(path.c_str(), &info), 0) << path;
    EXPECT_TRUE(S_ISSOCK(info.st_mode)) << path;
    EXPECT_EQ(info.st_mode & 07777, 0660u) << path;
    EXPECT_EQ(info.st_uid, 0u) << path;
    EXPECT_EQ(info.st_gid, kNogroup) << path;
  }
  std::string socket = socket_;
  Checks outsider = RunAs(kStranger, kStranger, [&](Reporter& report) {
    auto fd = common::ConnectSeqpacket(socket + ".fd");
    report.Check("fd_channel", fd.ok() ? "connected" : std::string(absl::StatusCodeToString(fd.status().code())));
    int stream = ConnectStream(socket);
    report.Check("grpc_socket", stream >= 0 ? "connected" : ErrnoName(errno));
  });
  EXPECT_EQ(outsider["fd_channel"], "PERMISSION_DENIED");
  EXPECT_EQ(outsider["grpc_socket"], "EACCES");
  Checks member = RunAs(kStranger, kNogroup, [&](Reporter& report) {
    Wire wire(socket);
    v1::StatusResponse status;
    report.Check("status", wire.Status(&status));
    report.Check("uid_seen", std::to_string(status.uid()));
  });
  EXPECT_EQ(member["status"], "OK");
  EXPECT_EQ(member["uid_seen"], "0");
}

// ---------------------------------------------------------------------------------------
// The daemon as another uid

// argv that runs `program` as uid:gid (stderr joined to stdout, `env` entries NAME=VALUE
// set, TENSORD_SOCKET unset) through this binary's --as mode.
std::vector<std::string> AsUser(uid_t uid, gid_t gid, const std::vector<std::string>& env,
                                const std::vector<std::string>& program) {
  std::vector<std::string> argv = {SelfExe(), "--as", std::to_string(uid), std::to_string(gid)};
  for (const std::string& entry : env) {
    argv.push_back("--env");
    argv.push_back(entry);
  }
  argv.push_back("--");
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

// Waits until a daemon serves on `socket`; false when it did not within 4 s.
bool Serving(const std::string& socket) {
  // A sanitized daemon on a loaded machine can take seconds to start.
  for (auto deadline = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < deadline;) {
    struct stat info{};
    if (stat(socket.c_str(), &info) == 0 && Accepts(socket + ".fd")) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// True once `child` has exited by itself (a zombie until reaped), within `timeout`. Its
// output can then be read without blocking on a silent, living process.
bool Exits(const ChildProcess& child, std::chrono::milliseconds timeout) {
  for (auto deadline = std::chrono::steady_clock::now() + timeout; std::chrono::steady_clock::now() < deadline;) {
    std::ifstream stat("/proc/" + std::to_string(child.pid()) + "/stat");
    std::string pid, comm, state;
    stat >> pid >> comm >> state;
    if (state == "Z") return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// A directory only uid:gid may use.
std::string PrivateDirOf(uid_t uid, gid_t gid) {
  std::string dir = MakeTempDir();
  if (chown(dir.c_str(), uid, gid) != 0 || chmod(dir.c_str(), 0700) != 0) ADD_FAILURE() << "chown " << dir;
  return dir;
}

TEST(AclDaemon, ClientsRefuseADaemonRunningAsAnUnexpectedUid) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the daemon as uid " << kNobody;
  // Root's and made like /tmp (sticky, writable by all): uid 65534 can serve there, and the
  // clients' directory rule lets everyone connect, so what refuses is the daemon uid check.
  std::string dir = MakeTempDir();
  ASSERT_EQ(chmod(dir.c_str(), 01777), 0);
  std::string socket = dir + "/tensord.sock";
  ChildProcess daemon(AsUser(kNobody, kNogroup, {}, {TENSORD_BIN, "--socket", socket, "--log-level", "warn"}));
  if (!Serving(socket)) {
    std::string line = Exits(daemon, 1s) ? daemon.WaitForLine("") : "(still running)";
    daemon.Kill(SIGKILL);
    std::filesystem::remove_all(dir);
    if (line.rfind("exec-failed", 0) == 0) GTEST_SKIP() << "uid " << kNobody << " cannot run " << TENSORD_BIN << ": " << line;
    FAIL() << "tensord as uid " << kNobody << " did not start: " << line;
  }
  // Root's client does not trust a daemon of uid 65534...
  ChildProcess root_peer(PeerArgs({"produce", socket, "ns/x", "4", "1"}));
  std::string refused = root_peer.WaitForLine("error");
  EXPECT_NE(refused.find("PERMISSION_DENIED"), std::string::npos) << refused;
  EXPECT_NE(refused.find("runs as uid 65534"), std::string::npos) << refused;
  root_peer.Wait();
  // ...while a client of that uid does.
  ChildProcess own_peer(AsUser(kNobody, kNogroup, {}, PeerArgs({"produce", socket, "ns/x", "4", "1"})));
  EXPECT_EQ(own_peer.WaitForLine("published"), "published 1");
  own_peer.Wait();
  int status = daemon.Kill(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::filesystem::remove_all(dir);
}

// Runs tensord as uid 65534 on its per-user default socket and returns its error line
// once it has exited (it is expected to refuse).
std::string RefusalOf(const std::string& runtime_dir) {
  ChildProcess daemon(AsUser(kNobody, kNogroup, {"XDG_RUNTIME_DIR=" + runtime_dir}, {TENSORD_BIN, "--log-level", "warn"}));
  if (!Exits(daemon, 5s)) {
    daemon.Kill(SIGKILL);
    ADD_FAILURE() << "tensord served from " << runtime_dir;
    return "";
  }
  std::string line = daemon.WaitForLine("tensord:");
  int status = daemon.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << line;
  return line;
}

TEST(AclDaemon, ThePerUserSocketDirectoryIsPrivateAndMustBeOurs) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the daemon as uid " << kNobody;
  std::string runtime = PrivateDirOf(kNobody, kNogroup);
  std::string dir = runtime + "/tensord";
  std::string socket = dir + "/tensord.sock";
  {
    ChildProcess daemon(AsUser(kNobody, kNogroup, {"XDG_RUNTIME_DIR=" + runtime}, {TENSORD_BIN, "--log-level", "warn"}));
    if (!Serving(socket)) {
      std::string line = Exits(daemon, 1s) ? daemon.WaitForLine("") : "(still running)";
      daemon.Kill(SIGKILL);
      std::filesystem::remove_all(runtime);
      if (line.rfind("exec-failed", 0) == 0) GTEST_SKIP() << "uid " << kNobody << " cannot run " << TENSORD_BIN;
      FAIL() << "tensord did not serve on " << socket << ": " << line;
    }
    struct stat info{};
    ASSERT_EQ(lstat(dir.c_str(), &info), 0);
    EXPECT_TRUE(S_ISDIR(info.st_mode));
    EXPECT_EQ(info.st_mode & 07777, 0700u);
    EXPECT_EQ(info.st_uid, kNobody);
    for (const std::string& path : {socket, socket + ".fd"}) {
      ASSERT_EQ(stat(path.c_str(), &info), 0) << path;
      EXPECT_EQ(info.st_mode & 07777, 0660u) << path;
      EXPECT_EQ(info.st_uid, kNobody) << path;
    }
    int status = daemon.Kill(SIGTERM);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  // Someone else's directory, a shared one, and a symlink are all refused.
  ASSERT_EQ(chown(dir.c_str(), 0, 0), 0);
  std::string line = RefusalOf(runtime);
  EXPECT_NE(line.find("owned by uid 0"), std::string::npos) << line;
  EXPECT_NE(line.find("refusing"), std::string::npos) << line;
  ASSERT_EQ(chown(dir.c_str(), kNobody, kNogroup), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  line = RefusalOf(runtime);
  EXPECT_NE(line.find("mode 0755"), std::string::npos) << line;
  std::filesystem::remove_all(dir);
  std::string elsewhere = runtime + "/elsewhere";
  ASSERT_EQ(mkdir(elsewhere.c_str(), 0700), 0);
  ASSERT_EQ(chown(elsewhere.c_str(), kNobody, kNogroup), 0);
  ASSERT_EQ(symlink(elsewhere.c_str(), dir.c_str()), 0);
  line = RefusalOf(runtime);
  EXPECT_NE(line.find("not a directory"), std::string::npos) << line;
  std::filesystem::remove_all(runtime);
}

// ---------------------------------------------------------------------------------------
// Sockets someone else serves: a client gives its session token to its daemon only

// Removes a path and everything under it when the scope ends.
struct RemovedAtEnd {
  std::string path;
  ~RemovedAtEnd() { std::filesystem::remove_all(path); }
};

// A gRPC socket served by another process: bound at `path` (mode 0666) by this process,
// listened on by a child running as uid:gid, which then exits. SO_PEERCRED reports whoever
// called listen(), so a client connecting sees that child as its peer; connections wait in
// the backlog until Drain() accepts them here and reads what each one sent.
class FakeGrpcSocket {
 public:
  FakeGrpcSocket(const std::string& path, uid_t uid, gid_t gid) {
    listener_.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    if (!listener_ || bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        chmod(path.c_str(), 0666) != 0) {
      ADD_FAILURE() << "bind " << path << ": " << std::strerror(errno);
      return;
    }
    listener_pid_ = fork();
    if (listener_pid_ == 0) _exit(BecomeUser(uid, gid) && listen(listener_.get(), 16) == 0 ? 0 : 1);
    int status = 0;
    waitpid(listener_pid_, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ADD_FAILURE() << "listen on " << path << " as uid " << uid;
  }

  pid_t listener_pid() const { return listener_pid_; }

  struct Received {
    int connections = 0;
    std::string bytes;
  };
  // Accepts every connection waiting and reads each to its end (its client must be gone).
  Received Drain() {
    Received received;
    while (true) {
      common::UniqueFd connection(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!connection) break;
      ++received.connections;
      char chunk[4096];
      pollfd pfd{connection.get(), POLLIN, 0};
      while (poll(&pfd, 1, 2000) == 1) {
        ssize_t n = read(connection.get(), chunk, sizeof(chunk));
        if (n <= 0) break;
        received.bytes.append(chunk, static_cast<size_t>(n));
      }
    }
    return received;
  }

 private:
  common::UniqueFd listener_;
  pid_t listener_pid_ = -1;
};

// What the test peer says when it runs as uid 65533 (a member of the daemon's socket group,
// with no XDG_RUNTIME_DIR) and acquires team/base through the socket `env` leads it to:
// "held <sum>" or its error line.
std::string VictimHolds(const std::vector<std::string>& env) {
  std::vector<std::string> with_env = env;
  with_env.push_back("XDG_RUNTIME_DIR=");
  ChildProcess victim(AsUser(kStranger, kNogroup, with_env, PeerArgs({"hold", "", "team/base"})));
  std::string line = victim.WaitForLine("");
  while (!line.empty() && line.rfind("held", 0) != 0 && line.rfind("error", 0) != 0) line = victim.WaitForLine("");
  return line;  // the destructor kills a victim that holds (it sleeps)
}

TEST_F(AclTest, APerUserDirectoryAnotherUidPlantedIsRefusedBeforeAnyConnection) {
  // The attack: with XDG_RUNTIME_DIR unset, uid 65533's per-user socket is
  // /tmp/tensord-65533/tensord.sock. uid 65534 made that directory first, linked the real
  // daemon's fd channel into it (which hands out a genuine session) and serves a gRPC socket
  // of its own there, to collect the session token sent on every call.
  const std::string dir = "/tmp/tensord-" + std::to_string(kStranger);
  struct stat existing{};
  if (lstat(dir.c_str(), &existing) == 0) GTEST_SKIP() << dir << " exists already; not touching it";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  RemovedAtEnd cleanup{dir};
  ASSERT_EQ(chown(dir.c_str(), kNobody, kNogroup), 0);
  FakeGrpcSocket fake(dir + "/tensord.sock", kNobody, kNogroup);
  ASSERT_EQ(symlink((socket_ + ".fd").c_str(), (dir + "/tensord.sock.fd").c_str()), 0);

  std::string line = VictimHolds({});
  EXPECT_NE(line.find("PERMISSION_DENIED"), std::string::npos) << line;
  EXPECT_NE(line.find("socket directory " + dir + " is a directory owned by uid 65534 with mode 0755"),
            std::string::npos) << line;
  EXPECT_NE(line.find("TENSORD_SOCKET"), std::string::npos) << line;  // what to do
  FakeGrpcSocket::Received received = fake.Drain();
  EXPECT_EQ(received.connections, 0);
  EXPECT_EQ(received.bytes.size(), 0u);
}

TEST_F(AclTest, ASocketDirectoryOfAnotherUidIsRefusedBeforeAnyConnection) {
  // The same trap through TENSORD_SOCKET.
  std::string dir = MakeTempDir();
  RemovedAtEnd cleanup{dir};
  ASSERT_EQ(chown(dir.c_str(), kNobody, kNogroup), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  const std::string socket = dir + "/tensord.sock";
  FakeGrpcSocket fake(socket, kNobody, kNogroup);
  ASSERT_EQ(symlink((socket_ + ".fd").c_str(), (socket + ".fd").c_str()), 0);

  std::string line = VictimHolds({"TENSORD_SOCKET=" + socket});
  EXPECT_NE(line.find("PERMISSION_DENIED"), std::string::npos) << line;
  EXPECT_NE(line.find("socket directory " + dir + " is a directory owned by uid 65534 with mode 0755"),
            std::string::npos) << line;
  FakeGrpcSocket::Received received = fake.Drain();
  EXPECT_EQ(received.connections, 0);
  EXPECT_EQ(received.bytes.size(), 0u);
}

TEST_F(AclTest, AGrpcSocketNotServedByTheFdChannelsDaemonNeverSeesTheToken) {
  // A directory the rule accepts (root's, 0755) holding a link to the real daemon's fd
  // channel, next to a gRPC socket someone else serves.
  std::string dir = MakeTempDir();
  RemovedAtEnd cleanup{dir};
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  const std::string socket = dir + "/tensord.sock";
  ASSERT_EQ(symlink((socket_ + ".fd").c_str(), (socket + ".fd").c_str()), 0);
  const std::string daemon = "not by the tensord on " + socket + ".fd (uid 0, pid " +
                             std::to_string(daemon_->pid()) + "): refusing to send the session token";
  {
    // Served by another uid.
    FakeGrpcSocket fake(socket, kNobody, kNogroup);
    std::string line = VictimHolds({"TENSORD_SOCKET=" + socket});
    EXPECT_NE(line.find("PERMISSION_DENIED"), std::string::npos) << line;
    EXPECT_NE(line.find("the gRPC socket " + socket + " is served by uid 65534 (pid " +
                        std::to_string(fake.listener_pid()) + "), " + daemon),
              std::string::npos) << line;
    FakeGrpcSocket::Received received = fake.Drain();
    EXPECT_EQ(received.connections, 1);  // connected to read its peer, then closed
    EXPECT_EQ(received.bytes.size(), 0u) << "the refused peer received data";
    ASSERT_EQ(unlink(socket.c_str()), 0);
  }
  {
    // Served by root, a trusted uid, but not by the daemon's process.
    FakeGrpcSocket fake(socket, 0, 0);
    std::string line = VictimHolds({"TENSORD_SOCKET=" + socket});
    EXPECT_NE(line.find("PERMISSION_DENIED"), std::string::npos) << line;
    EXPECT_NE(line.find("is served by uid 0 (pid " + std::to_string(fake.listener_pid()) + "), " + daemon),
              std::string::npos) << line;
    FakeGrpcSocket::Received received = fake.Drain();
    EXPECT_EQ(received.connections, 1);
    EXPECT_EQ(received.bytes.size(), 0u) << "the refused peer received data";
    ASSERT_EQ(unlink(socket.c_str()), 0);
  }
  // The same directory with the daemon's own gRPC socket linked in works.
  ASSERT_EQ(symlink(socket_.c_str(), socket.c_str()), 0);
  EXPECT_EQ(VictimHolds({"TENSORD_SOCKET=" + socket}), "held 16.000000");
}

}  // namespace
}  // namespace tensord

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--as") return tensord::testing::RunProgramAs(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return tensord::testing::RunAllTestsReportingSkips();
}
