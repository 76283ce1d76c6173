// A hostile second uid against the real `tensord` running as root: each attack of the
// security review, kept here so it stays fixed.
//
// - waits by id on tensors not yet allocated (they were granted tensors published later in
//   a namespace the uid cannot read), and waits by name, take and prefix take there;
// - Stat telling whether a name exists in such a namespace;
// - connections that never say HELLO, idle gRPC connections, and sessions, taking every
//   slot from other users;
// - metadata (zero-byte tensors with big tags) and host memory outside ACL'd namespaces,
//   costing the daemon without limit;
// - seals a reader adds to a buffer it was given;
// - a lock file or a take-over socket planted beside a root daemon's socket in a shared
//   directory.
//
// Needs root (the uid 65534 part runs in forked children); skipped otherwise.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/memory/host/memfd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gtest_run.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/proc_info.h"
#include "tests/integration/raw_wire.h"
#include "tests/integration/second_uid.h"

namespace tensord {
namespace {

using namespace testing;  // tensord::testing: the daemon fixture, raw wire and second-uid helpers

// A child as another uid that runs alongside the test: the test reads its checks as they
// come and lets it go on with Release().
class ChildAs {
 public:
  ChildAs(uid_t uid, gid_t gid, const std::function<void(Reporter&, const std::function<void()>&)>& body) {
    int out[2], gate[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(gate, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(out[0]);
      close(gate[1]);
      Reporter reporter(out[1]);
      if (!BecomeUser(uid, gid)) _exit(2);
      const int gate_fd = gate[0];
      body(reporter, [gate_fd] {
        char byte;
        (void)read(gate_fd, &byte, 1);
      });
      _exit(0);
    }
    close(out[1]);
    close(gate[0]);
    out_ = out[0];
    gate_ = gate[1];
  }
  ~ChildAs() {
    Release();
    Wait();
  }
  // The value of check `label`, read as it arrives; empty after the timeout.
  std::string Await(const std::string& label, std::chrono::milliseconds timeout = 20s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!checks_.contains(label) && std::chrono::steady_clock::now() < deadline) {
      pollfd pfd{out_, POLLIN, 0};
      if (poll(&pfd, 1, 100) <= 0) continue;
      char chunk[4096];
      ssize_t n = read(out_, chunk, sizeof(chunk));
      if (n <= 0) break;
      pending_.append(chunk, static_cast<size_t>(n));
      for (size_t end; (end = pending_.find('\n')) != std::string::npos; pending_.erase(0, end + 1)) {
        std::string line = pending_.substr(0, end);
        if (line.rfind("check ", 0) != 0) continue;
        size_t space = line.find(' ', 6);
        checks_[line.substr(6, space - 6)] = space == std::string::npos ? "" : line.substr(space + 1);
      }
    }
    return checks_.contains(label) ? checks_[label] : std::string();
  }
  void Release() {
    if (gate_ >= 0) close(gate_);
    gate_ = -1;
  }
  bool Wait() {
    if (pid_ <= 0) return false;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (out_ >= 0) close(out_);
    out_ = -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int gate_ = -1;
  std::string pending_;
  Checks checks_;
};

// Bytes a stream socket receives within `timeout` until the peer closes (or the timeout).
std::string ReadUntilClosed(int fd, std::chrono::milliseconds timeout, bool* closed) {
  std::string bytes;
  *closed = false;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 50) <= 0) continue;
    char chunk[4096];
    ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) {
      *closed = true;
      break;
    }
    bytes.append(chunk, static_cast<size_t>(n));
  }
  return bytes;
}

class HostileUidTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as uid " << kNobody;
    config_ = MakeTempDir() + ".toml";
    std::ofstream file(config_);
    file << "[acl.shared]\nread_uids = [" << kNobody << "]\n";
    file.close();
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{
        "--config", config_, "--socket-group", std::to_string(kNogroup), "--max-host-bytes", "64MiB",
        "--max-connections-per-uid", "8", "--max-sessions-per-uid", "4", "--max-metadata-bytes-per-uid",
        "1MiB"});
    chmod(daemon_->dir().c_str(), 0711);
    socket_ = daemon_->socket();
    Checks produced = RunAs(0, 0, [&](Reporter& report) {
      Wire wire(socket_);
      report.Check("shared", wire.PublishFilled("shared/x", 1024, 2.5f));
      report.Check("private", wire.PublishFilled("private/x", 1024, 7.0f));
    });
    ASSERT_EQ(produced["shared"], "OK");
    ASSERT_EQ(produced["private"], "OK");
  }
  void TearDown() override {
    daemon_.reset();
    if (!config_.empty()) {
      std::filesystem::remove(config_);
      std::filesystem::remove(config_.substr(0, config_.size() - 5));
    }
  }

  std::string config_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::string socket_;
};

TEST_F(HostileUidTest, WaitsAreGrantedOnlyWhatTheUidMayRead) {
  Checks checks = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    Wire wire(socket_);
    // Its own unnamespaced tensor shows where the ids are.
    v1::AllocateResponse own;
    report.Check("own", wire.Allocate("", 1, &own));
    int refused = 0;
    for (uint64_t id = own.tensor().tensor_id() + 1; id <= own.tensor().tensor_id() + 100; ++id) {
      v1::AcquireRequest request;
      request.set_tensor_id(id);
      request.set_forever(true);
      v1::AcquireResponse response;
      if (wire.Acquire(request, &response).error_code() == grpc::StatusCode::NOT_FOUND) ++refused;
    }
    report.Check("id_waits_refused", std::to_string(refused));
    v1::AcquireRequest by_name;
    by_name.set_name("private/later");
    by_name.set_forever(true);
    v1::AcquireResponse ignored;
    report.Check("name_wait", wire.Acquire(by_name, &ignored));
    report.Check("take", wire.Take("private/later"));
    report.Check("take_prefix", wire.Take("private/"));
    report.Check("take_readable_ns", wire.Take("shared/"));
  });
  EXPECT_EQ(checks["own"], "OK");
  EXPECT_EQ(checks["id_waits_refused"], "100");
  EXPECT_EQ(checks["name_wait"], "PERMISSION_DENIED");
  EXPECT_EQ(checks["take"], "PERMISSION_DENIED");
  EXPECT_EQ(checks["take_prefix"], "PERMISSION_DENIED");
  EXPECT_EQ(checks["take_readable_ns"], "PERMISSION_DENIED") << "a take unbinds: it needs write access";
}

TEST_F(HostileUidTest, StatSaysTheSameForAnExistingAndAMissingName) {
  Checks checks = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    Wire wire(socket_);
    for (const char* name : {"private/x", "private/missing"}) {
      v1::StatRequest request;
      request.set_name(name);
      v1::StatResponse response;
      grpc::Status status = wire.Stat(request, &response);
      report.Check(name, CodeName(status.error_code()) + " " + status.error_message());
    }
  });
  EXPECT_EQ(checks["private/x"].rfind("PERMISSION_DENIED", 0), 0u) << checks["private/x"];
  EXPECT_EQ(checks["private/x"], checks["private/missing"]);
}

TEST_F(HostileUidTest, ConnectionsWithoutHelloAreCappedPerUidAndTimedOut) {
  ChildAs hog(kNobody, kNogroup, [&](Reporter& report, const std::function<void()>& wait) {
    std::vector<common::UniqueFd> idle;
    for (int i = 0; i < 8; ++i) idle.push_back(ConnectFdChannel(socket_));
    common::UniqueFd ninth = ConnectFdChannel(socket_);
    FdReply reply = Receive(ninth.get());
    report.Check("ninth", reply.kind == FdReply::kMessage && reply.response.has_error()
                              ? CodeName(static_cast<grpc::StatusCode>(reply.response.error().code())) + " " +
                                    reply.response.error().message()
                              : "accepted");
    report.Check("holding", "8");
    wait();
    // The daemon closes connections that said nothing for 5 s.
    FdReply expired = Receive(idle[0].get(), 8s);
    report.Check("expired", expired.kind == FdReply::kMessage && expired.response.has_error()
                                ? CodeName(static_cast<grpc::StatusCode>(expired.response.error().code()))
                                : "no error");
    report.Check("closed", Receive(idle[0].get(), 2s).kind == FdReply::kClosed ? "yes" : "no");
    RawSession session = OpenSession(socket_);
    report.Check("hello_after", session.token().empty() ? "refused" : "welcome");
  });
  std::string ninth = hog.Await("ninth");
  EXPECT_EQ(ninth.rfind("RESOURCE_EXHAUSTED", 0), 0u) << ninth;
  EXPECT_NE(ninth.find("--max-connections-per-uid 8"), std::string::npos) << ninth;
  ASSERT_EQ(hog.Await("holding"), "8");
  // Root is not locked out by the other uid's connections.
  RawSession root = OpenSession(socket_);
  EXPECT_FALSE(root.token().empty());
  hog.Release();
  EXPECT_EQ(hog.Await("expired"), "DEADLINE_EXCEEDED");
  EXPECT_EQ(hog.Await("closed"), "yes");
  EXPECT_EQ(hog.Await("hello_after"), "welcome");
  EXPECT_TRUE(hog.Wait());
}

TEST_F(HostileUidTest, SessionsAreCappedPerUid) {
  Checks checks = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    std::vector<RawSession> sessions;
    for (int i = 0; i < 4; ++i) sessions.push_back(OpenSession(socket_));
    common::UniqueFd fifth = ConnectFdChannel(socket_);
    SendRaw(fifth.get(), Bytes(HelloRequest()));
    FdReply reply = Receive(fifth.get());
    report.Check("fifth", reply.kind == FdReply::kMessage && reply.response.has_error()
                              ? CodeName(static_cast<grpc::StatusCode>(reply.response.error().code())) + " " +
                                    reply.response.error().message()
                              : "welcome");
  });
  EXPECT_EQ(checks["fifth"].rfind("RESOURCE_EXHAUSTED", 0), 0u) << checks["fifth"];
  EXPECT_NE(checks["fifth"].find("--max-sessions-per-uid 4"), std::string::npos) << checks["fifth"];
}

TEST_F(HostileUidTest, IdleGrpcConnectionsAreCappedPerUidWithAGoAwaySayingWhy) {
  const std::string grpc_socket = socket_;
  ChildAs hog(kNobody, kNogroup, [&](Reporter& report, const std::function<void()>& wait) {
    std::vector<int> idle;
    for (int i = 0; i < 8; ++i) idle.push_back(ConnectStream(grpc_socket));
    int ninth = ConnectStream(grpc_socket);
    bool closed = false;
    std::string bytes = ReadUntilClosed(ninth, 3s, &closed);
    close(ninth);
    report.Check("ninth_closed", closed ? "yes" : "no");
    size_t text = bytes.find("RESOURCE_EXHAUSTED");
    report.Check("ninth_says", text == std::string::npos ? "nothing" : bytes.substr(text));
    {
      // A client of that uid is refused at HELLO, which names the cap (a gRPC client that
      // has written to a refused connection only sees it closed).
      common::UniqueFd fd = ConnectFdChannel(grpc_socket);
      SendRaw(fd.get(), Bytes(HelloRequest()));
      FdReply reply = Receive(fd.get());
      report.Check("hello_says", reply.kind == FdReply::kMessage && reply.response.has_error()
                                     ? CodeName(static_cast<grpc::StatusCode>(reply.response.error().code())) +
                                           " " + reply.response.error().message()
                                     : "welcome");
    }
    report.Check("holding", "8");
    wait();
    for (int i = 0; i < 4; ++i) close(idle[i]);
    // Once gRPC has closed them, the uid may connect again.
    std::string again = "refused";
    for (auto deadline = std::chrono::steady_clock::now() + 5s;
         again == "refused" && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(50ms)) {
      int fd = ConnectStream(grpc_socket);
      bool gone = false;
      std::string reply = ReadUntilClosed(fd, 250ms, &gone);
      if (!gone && reply.find("RESOURCE_EXHAUSTED") == std::string::npos) again = "accepted";
      close(fd);
    }
    report.Check("again", again);
    for (int i = 4; i < 8; ++i) close(idle[i]);
  });
  EXPECT_EQ(hog.Await("ninth_closed"), "yes");
  std::string says = hog.Await("ninth_says");
  EXPECT_NE(says.find("--max-connections-per-uid 8"), std::string::npos) << says;
  std::string hello_says = hog.Await("hello_says");
  EXPECT_EQ(hello_says.rfind("RESOURCE_EXHAUSTED gRPC socket", 0), 0u) << hello_says;
  EXPECT_NE(hello_says.find("--max-connections-per-uid 8"), std::string::npos) << hello_says;
  ASSERT_EQ(hog.Await("holding"), "8");
  // Root's calls go on while the other uid holds its whole share.
  Checks root = RunAs(0, 0, [&](Reporter& report) {
    Wire wire(socket_);
    v1::StatusResponse status;
    report.Check("status", wire.Status(&status));
  });
  EXPECT_EQ(root["status"], "OK");
  hog.Release();
  EXPECT_EQ(hog.Await("again"), "accepted");
  EXPECT_TRUE(hog.Wait());
}

TEST_F(HostileUidTest, MetadataAndHostMemoryOutsideAclNamespacesAreBoundedPerUid) {
  const pid_t daemon_pid = daemon_->pid();
  const int64_t rss_before_kib = RssKiB(daemon_pid);
  Checks checks = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    Wire wire(socket_);
    // Host memory without a namespace: a quarter of --max-host-bytes by default.
    grpc::Status refused;
    int mib = 0;
    for (; mib < 64; ++mib) {
      v1::AllocateResponse response;
      refused = wire.Allocate("", (1 << 20) / 4, &response);
      if (!refused.ok()) break;
    }
    report.Check("host_mib", std::to_string(mib));
    report.Check("host_refused", CodeName(refused.error_code()) + " " + refused.error_message());
    // Zero-byte tensors need no memory, but 16 KB of tags each stays in the daemon.
    v1::AllocateRequest tagged;
    *tagged.mutable_desc() = Float32({0});
    for (int i = 0; i < 4; ++i) (*tagged.mutable_tags())[absl::StrCat("k", i)] = std::string(4000, 'v');
    int made = 0;
    for (; made < 10'000; ++made) {
      v1::AllocateResponse response;
      refused = wire.Allocate(tagged, &response);
      if (!refused.ok()) break;
    }
    report.Check("tagged_made", std::to_string(made));
    report.Check("tagged_refused", CodeName(refused.error_code()) + " " + refused.error_message());
  });
  const int made = std::stoi(checks["tagged_made"]);
  EXPECT_GT(made, 30);
  EXPECT_LT(made, 70) << "1 MiB of metadata at about 16.5 KB a tensor";
  EXPECT_EQ(checks["tagged_refused"].rfind("RESOURCE_EXHAUSTED", 0), 0u) << checks["tagged_refused"];
  EXPECT_NE(checks["tagged_refused"].find("--max-metadata-bytes-per-uid"), std::string::npos);
  EXPECT_EQ(checks["host_mib"], "16");
  EXPECT_NE(checks["host_refused"].find("--max-host-bytes-per-uid 16777216"), std::string::npos)
      << checks["host_refused"];
  // What the other uid made went with its session, and root still has the rest.
  Checks root = RunAs(0, 0, [&](Reporter& report) {
    Wire wire(socket_);
    v1::AllocateResponse response;
    report.Check("root_40mib", wire.Allocate("", (40 << 20) / 4, &response));
  });
  EXPECT_EQ(root["root_40mib"], "OK");
  EXPECT_LT(RssKiB(daemon_pid) - rss_before_kib, int64_t{32} << 10) << "KiB of daemon memory";
}

// A uid that may only read a namespace acquired its tensors, handed each over for an hour
// and exited: the owner deleted them, 903 MiB stayed in use, charged to no one, and the
// owner's next large put failed. What pending hand-overs pin now counts against their
// maker's --max-host-bytes-per-uid (16 MiB here), and the maker may cancel them.
TEST_F(HostileUidTest, HandOversPinOnlyTheirMakersHostQuotaAndTheMakerCancelsThem) {
  constexpr int64_t kFloats = (6 << 20) / 4;  // 6 MiB a tensor
  Checks owner = RunAs(0, 0, [&](Reporter& report) {
    Wire wire(socket_);
    for (int i = 0; i < 4; ++i) report.Check(absl::StrCat("put", i), wire.PublishFilled(absl::StrCat("shared/big", i), kFloats, 1.0f));
  });
  for (int i = 0; i < 4; ++i) ASSERT_EQ(owner[absl::StrCat("put", i)], "OK");
  auto status_of = [&](Wire& wire, v1::StatusResponse* status) {
    grpc::ClientContext context;
    wire.Prepare(context);
    return wire.stub().Status(&context, v1::StatusRequest(), status);
  };
  Checks reader = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    Wire wire(socket_);
    int made = 0;
    grpc::Status refused;
    for (int i = 0; i < 4; ++i) {
      v1::AcquireResponse lease;
      if (!wire.AcquireName(absl::StrCat("shared/big", i), &lease).ok()) break;
      v1::HandOverRequest request;
      request.set_lease_id(lease.lease_id());
      request.set_ttl_ms(3600 * 1000);
      v1::HandOverResponse token;
      grpc::ClientContext context;
      wire.Prepare(context);
      refused = wire.stub().HandOver(&context, request, &token);
      if (!refused.ok()) break;
      ++made;
    }
    report.Check("made", std::to_string(made));
    report.Check("refused", CodeName(refused.error_code()) + " " + refused.error_message());
    v1::StatusResponse status;
    report.Check("status", status_of(wire, &status));
    report.Check("pins", std::to_string(status.hand_over_usage_size()));
    if (status.hand_over_usage_size() == 1) {
      report.Check("pin_uid", std::to_string(status.hand_over_usage(0).uid()));
      report.Check("pin_bytes", std::to_string(status.hand_over_usage(0).host_bytes()));
    }
  });  // the reader exits; its tokens stay
  EXPECT_EQ(reader["made"], "2") << "16 MiB hold two 6 MiB buffers, not three";
  EXPECT_EQ(reader["refused"].rfind("RESOURCE_EXHAUSTED", 0), 0u) << reader["refused"];
  EXPECT_NE(reader["refused"].find("--max-host-bytes-per-uid 16777216"), std::string::npos) << reader["refused"];
  EXPECT_EQ(reader["status"], "OK");
  EXPECT_EQ(reader["pins"], "1");
  EXPECT_EQ(reader["pin_uid"], std::to_string(kNobody));
  EXPECT_EQ(reader["pin_bytes"], std::to_string(12 << 20));

  // The owner deletes its tensors; the two handed over stay, and 56 MiB do not fit beside them.
  Checks crowded = RunAs(0, 0, [&](Reporter& report) {
    Wire wire(socket_);
    for (int i = 0; i < 4; ++i) report.Check(absl::StrCat("rm", i), CodeName(wire.Delete(absl::StrCat("shared/big", i)).error_code()));
    v1::AllocateResponse response;
    grpc::Status put = wire.Allocate("shared", (56 << 20) / 4, &response);
    report.Check("put", CodeName(put.error_code()));
    v1::StatusResponse status;
    report.Check("status", status_of(wire, &status));
    report.Check("pins", status.hand_over_usage_size() == 1 ? std::to_string(status.hand_over_usage(0).hand_overs()) : "none");
  });
  EXPECT_EQ(crowded["put"], "RESOURCE_EXHAUSTED");
  EXPECT_EQ(crowded["pins"], "2") << "root sees every uid's pins";

  Checks cancelled = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    Wire wire(socket_);
    v1::CancelHandOversResponse response;
    grpc::ClientContext context;
    wire.Prepare(context);
    report.Check("cancel", wire.stub().CancelHandOvers(&context, v1::CancelHandOversRequest(), &response));
    report.Check("cancelled", std::to_string(response.cancelled()));
  });
  EXPECT_EQ(cancelled["cancel"], "OK");
  EXPECT_EQ(cancelled["cancelled"], "2");
  Checks roomy = RunAs(0, 0, [&](Reporter& report) {
    Wire wire(socket_);
    v1::AllocateResponse response;
    report.Check("put", CodeName(wire.Allocate("shared", (56 << 20) / 4, &response).error_code()));
  });
  EXPECT_EQ(roomy["put"], "OK") << "the memory went with the cancelled tokens";
}

TEST_F(HostileUidTest, SealsAReaderAddsChangeNothingForTheBrokerOrOtherReaders) {
  const int fds_before = StableFdCount(daemon_->pid());
  Checks reader = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    Wire wire(socket_);
    v1::AcquireResponse acquired;
    report.Check("acquire", wire.AcquireName("shared/x", &acquired));
    common::UniqueFd fd;
    report.Check("fetch", CodeName(wire.Fetch(acquired.tensor().buffer().buffer_id(), &fd)));
    // Its producer is gone, so no writable mapping stands in the way of F_SEAL_WRITE.
    report.Check("seal_write", ErrnoName(fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE) == 0 ? 0 : errno));
    report.Check("seal_seal", ErrnoName(fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SEAL) == 0 ? 0 : errno));
  });
  EXPECT_EQ(reader["acquire"], "OK");
  EXPECT_EQ(reader["fetch"], "OK");
  EXPECT_EQ(reader["seal_write"], "OK");
  EXPECT_EQ(reader["seal_seal"], "OK");
  Checks root = RunAs(0, 0, [&](Reporter& report) {
    // Another reader still gets the data, private (copy-on-write) and shared read-only.
    Wire wire(socket_);
    v1::AcquireResponse acquired;
    report.Check("acquire", wire.AcquireName("shared/x", &acquired));
    common::UniqueFd fd;
    report.Check("fetch", CodeName(wire.Fetch(acquired.tensor().buffer().buffer_id(), &fd)));
    const v1::BufferRef& ref = acquired.tensor().buffer();
    void* cow = mmap(nullptr, ref.size(), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0);
    void* shared = mmap(nullptr, ref.size(), PROT_READ, MAP_SHARED, fd.get(), 0);
    report.Check("cow", cow == MAP_FAILED ? ErrnoName(errno)
                                         : std::to_string(static_cast<float*>(cow)[ref.offset() / 4]));
    report.Check("shared", shared == MAP_FAILED ? ErrnoName(errno)
                                               : std::to_string(static_cast<float*>(shared)[ref.offset() / 4]));
    if (cow != MAP_FAILED) munmap(cow, ref.size());
    if (shared != MAP_FAILED) munmap(shared, ref.size());
    // A producer in the same namespace is not held back by the sealed buffer.
    report.Check("republish", wire.PublishFilled("shared/x", 1024, 4.0f));
    v1::ReleaseResponse released;
    report.Check("release", wire.Release(acquired.lease_id(), &released));
    report.Check("delete", wire.Delete("shared/x"));
  });
  EXPECT_EQ(root["acquire"], "OK");
  EXPECT_EQ(root["cow"], std::to_string(2.5f));
  EXPECT_EQ(root["shared"], std::to_string(2.5f));
  EXPECT_EQ(root["republish"], "OK");
  EXPECT_EQ(root["delete"], "OK");
  // Both buffers are gone with their last hold: the sealed one is closed like any other.
  EXPECT_EQ(SettledFdCount(daemon_->pid(), fds_before - 1), fds_before - 1) << FdTargets(daemon_->pid());
}

// The paths beside a root daemon's socket in a directory every uid may write to (sticky, as
// /tmp): what uid 65534 plants there must not make root create, open or adopt anything.
class SharedDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to plant files as uid " << kNobody;
    root_ = MakeTempDir();  // root's, 0700: what the planted link points into
    shared_ = root_ + "/shared";
    ASSERT_EQ(mkdir(shared_.c_str(), 0755), 0);
    ASSERT_EQ(chmod(shared_.c_str(), 01777), 0);
    ASSERT_EQ(chmod(root_.c_str(), 0711), 0);  // 65534 may pass through to shared/
  }
  void TearDown() override {
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }
  // Runs the daemon on shared/NAME.sock with `extra` flags, as root, until it exits (it must
  // refuse to start); its exit status and everything it printed.
  std::pair<int, std::string> RunDaemonUntilExit(const std::string& name, std::vector<std::string> extra) {
    std::string command = absl::StrCat("exec ", TENSORD_BIN, " --socket ", shared_, "/", name, ".sock --log-level warn");
    for (const std::string& flag : extra) absl::StrAppend(&command, " ", flag);
    ChildProcess daemon({"/bin/sh", "-c", command + " 2>&1"});
    std::string output;
    for (std::string line; !(line = daemon.WaitForLine("", 30s)).empty();) output += line + "\n";
    return {daemon.Wait(), output};
  }

  std::string root_;
  std::string shared_;
};

// `ln -s /etc/victim /tmp/X.sock.lock` made root's `tensord --socket /tmp/X.sock` create
// /etc/victim. The lock file is never followed, and one of another uid is never used.
TEST_F(SharedDirectoryTest, ALockFileAnotherUidPlantedIsRefusedNeverFollowed) {
  const std::string victim = root_ + "/victim";
  Checks planted = RunAs(kNobody, kNogroup, [&](Reporter& report) {
    report.Check("link", symlink(victim.c_str(), (shared_ + "/a.sock.lock").c_str()) == 0 ? "ok" : ErrnoName(errno));
    int file = open((shared_ + "/b.sock.lock").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
    report.Check("file", file >= 0 ? "ok" : ErrnoName(errno));
    if (file >= 0) close(file);
  });
  ASSERT_EQ(planted["link"], "ok");
  ASSERT_EQ(planted["file"], "ok");

  auto [linked_status, linked_output] = RunDaemonUntilExit("a", {});
  EXPECT_TRUE(WIFEXITED(linked_status) && WEXITSTATUS(linked_status) == 1) << linked_output;
  EXPECT_THAT(linked_output, ::testing::HasSubstr("is a symbolic link: refusing to follow it")) << linked_output;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(victim))) << "root created the link's target";
  EXPECT_FALSE(std::filesystem::exists(shared_ + "/a.sock")) << "the daemon served anyway";

  auto [owned_status, owned_output] = RunDaemonUntilExit("b", {});
  EXPECT_TRUE(WIFEXITED(owned_status) && WEXITSTATUS(owned_status) == 1) << owned_output;
  EXPECT_THAT(owned_output, ::testing::HasSubstr(absl::StrCat("owned by uid ", kNobody, ": refusing to use it")))
      << owned_output;
  EXPECT_FALSE(std::filesystem::exists(shared_ + "/b.sock")) << "the daemon served anyway";
}

// Root's `tensord --socket X --take-over` adopted the forged snapshot of a take-over socket
// another uid had bound. It now asks who answers (SO_PEERCRED) before it sends anything.
TEST_F(SharedDirectoryTest, TakeOverRefusesADaemonOfAnotherUidBeforeSendingAnything) {
  const std::string path = shared_ + "/c.sock.takeover";
  ChildAs impostor(kNobody, kNogroup, [&](Reporter& report, const std::function<void()>& wait) {
    int listening = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    bool bound = bind(listening, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                 chmod(path.c_str(), 0777) == 0 && listen(listening, 4) == 0;
    report.Check("listening", bound ? "ok" : ErrnoName(errno));
    pollfd incoming{listening, POLLIN, 0};
    if (poll(&incoming, 1, 30000) != 1) {
      report.Check("received", "no connection within 30 s");
      return;
    }
    int connection = accept4(listening, nullptr, nullptr, SOCK_CLOEXEC);
    pollfd sent{connection, POLLIN, 0};
    char bytes[4096];
    ssize_t got = connection < 0 || poll(&sent, 1, 30000) != 1 ? -1 : recv(connection, bytes, sizeof(bytes), 0);
    // What the new daemon sent before it hung up: 0 (end of file) is the right answer.
    report.Check("received", got < 0 ? "no end of file within 30 s" : std::to_string(got));
    wait();
  });
  ASSERT_EQ(impostor.Await("listening"), "ok");

  auto [status, output] = RunDaemonUntilExit("c", {"--take-over"});
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << output;
  EXPECT_THAT(output, ::testing::HasSubstr(absl::StrCat("of uid ", kNobody, ", not root or this daemon's uid 0")))
      << output;
  EXPECT_EQ(impostor.Await("received"), "0") << "the new daemon sent the impostor its take-over request";
  EXPECT_FALSE(std::filesystem::exists(shared_ + "/c.sock")) << "the daemon served anyway";
}

}  // namespace
}  // namespace tensord

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--as") return tensord::testing::RunProgramAs(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return tensord::testing::RunAllTestsReportingSkips();
}
