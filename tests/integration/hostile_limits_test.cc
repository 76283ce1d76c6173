// The daemon's caps against clients that push them (hostile_fixture.h): sessions beyond
// --max-sessions and idle connections on the fd channel, leases and waits per session over
// gRPC, List answers that would not fit one message, and the daemon's own open-file limit.
#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "gtest/gtest.h"
#include "tensord/v1/broker.grpc.pb.h"
#include "tensord/v1/fd_channel.pb.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/hostile_fixture.h"
#include "tests/integration/raw_wire.h"

namespace tensord {
namespace {

namespace v1 = tensord::v1;
using namespace std::chrono_literals;
using namespace testing;  // tensord::testing: HostileTest, the daemon fixture, the raw wire helpers

// ---------------------------------------------------------------------------------------
// Caps

TEST_F(HostileTest, SessionsBeyondTheCapAreRefusedOnTheFdChannel) {
  StartDaemon({"--max-sessions", "3"});  // session_ is one
  RawSession second = OpenSession(daemon_->socket());
  RawSession third = OpenSession(daemon_->socket());
  ASSERT_FALSE(third.token().empty());
  common::UniqueFd fourth = ConnectFdChannel(daemon_->socket());
  ASSERT_TRUE(SendRaw(fourth.get(), Bytes(HelloRequest())));
  ExpectErrorThenClose(fourth.get(), grpc::StatusCode::RESOURCE_EXHAUSTED, "--max-sessions 3", "fourth session");

  // The public client passes the code and the reason on (not "is the daemon running?").
  ChildProcess peer({TENSORD_TEST_PEER, "produce", daemon_->socket(), "ns/x", "4", "1"});
  std::string line = peer.WaitForLine("error");
  EXPECT_NE(line.find("RESOURCE_EXHAUSTED: "), std::string::npos) << line;
  EXPECT_NE(line.find("--max-sessions 3"), std::string::npos) << line;
  peer.Wait();

  // Connections that never say HELLO are capped too (64 above the session cap).
  std::vector<common::UniqueFd> idle;
  for (int i = 0; i < 64; ++i) idle.push_back(ConnectFdChannel(daemon_->socket()));
  std::this_thread::sleep_for(100ms);
  common::UniqueFd refused = ConnectFdChannel(daemon_->socket());
  FdReply reply = Receive(refused.get());
  ASSERT_EQ(reply.kind, FdReply::kMessage);
  ASSERT_TRUE(reply.response.has_error());
  EXPECT_EQ(reply.response.error().code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // A session that ends makes room.
  idle.clear();
  second.fd.reset();
  bool opened = false;
  for (auto deadline = std::chrono::steady_clock::now() + 5s; !opened && std::chrono::steady_clock::now() < deadline;) {
    common::UniqueFd fd = ConnectFdChannel(daemon_->socket());
    SendRaw(fd.get(), Bytes(HelloRequest()));
    FdReply answer = Receive(fd.get());
    opened = answer.kind == FdReply::kMessage && answer.response.has_welcome();
    if (!opened) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(opened);
}

TEST_F(HostileTest, LeasesAndWaitsPerSessionAreCappedOverGrpc) {
  StartDaemon({"--max-leases-per-session", "5", "--max-waits-per-session", "2"});
  RawSession producer = OpenSession(daemon_->socket());
  Publish(producer, "ns/x", 16);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Acquire(session_, "ns/x").ok()) << i;
  v1::StatusResponse full = GetStatus();
  auto refused = Acquire(session_, "ns/x");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("--max-leases-per-session 5"), std::string::npos) << refused.status();
  v1::AllocateRequest allocate;
  allocate.set_ns("ns");
  *allocate.mutable_desc() = Float32({1024});
  grpc::ClientContext allocate_context;
  Authorize(allocate_context, token());
  v1::AllocateResponse allocated;
  EXPECT_EQ(CodeName(stub_->Allocate(&allocate_context, allocate, &allocated).error_code()), "RESOURCE_EXHAUSTED");
  v1::StatusResponse after = GetStatus();
  EXPECT_EQ(after.leases(), full.leases());
  EXPECT_EQ(after.tensors(), full.tensors());
  EXPECT_EQ(after.host_bytes_in_use(), full.host_bytes_in_use());

  // Waits: two may be pending on a stream, the third is refused at once.
  grpc::ClientContext context;
  Authorize(context, producer.token());
  auto stream = stub_->Session(&context);
  for (int i = 1; i <= 3; ++i) {
    v1::SessionRequest request;
    request.set_seq(i);
    request.mutable_acquire()->set_name("ns/later" + std::to_string(i));
    request.mutable_acquire()->set_forever(true);
    ASSERT_TRUE(stream->Write(request));
  }
  v1::SessionResponse reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.seq(), 3u);
  ASSERT_TRUE(reply.has_error()) << reply.ShortDebugString();
  EXPECT_EQ(reply.error().code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(reply.error().message().find("--max-waits-per-session 2"), std::string::npos) << reply.error().message();
  context.TryCancel();
}

// What a client older than paged List sends (no page_size) gets every name when they fit in
// one 4 MiB answer, else a clear RESOURCE_EXHAUSTED instead of a message its gRPC refuses;
// a paged request is bounded whatever it asks, and page tokens from nowhere are refused.
TEST_F(HostileTest, ListAnswersOldClientsWholeOrRefusedAndBoundsEveryPage) {
  ChildProcess peer({TENSORD_TEST_PEER, "publish-many", daemon_->socket(), "old", "25000"});
  ASSERT_EQ(peer.WaitForLine("published", 60s), "published 25000");
  peer.Wait();
  auto list = [this](const v1::ListRequest& request, v1::ListResponse* response) {
    grpc::ClientContext context;
    Authorize(context, token());
    return stub_->List(&context, request, response);
  };

  v1::ListRequest unpaged;
  unpaged.set_prefix("old/");
  v1::ListResponse response;
  grpc::Status status = list(unpaged, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_NE(status.error_message().find("'old/'"), std::string::npos) << status.error_message();
  EXPECT_NE(status.error_message().find("25000 names"), std::string::npos) << status.error_message();
  EXPECT_NE(status.error_message().find("page_size"), std::string::npos) << status.error_message();
  // A listing that fits is answered whole, as before paging.
  unpaged.set_prefix("old/" + std::string(190, 'n') + "-000042");
  response.Clear();
  status = list(unpaged, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.tensors_size(), 1);
  EXPECT_EQ(response.tensors(0).name(), unpaged.prefix());
  EXPECT_TRUE(response.next_page_token().empty());

  // Any page_size: at most 4096 entries and 1 MiB of them, the token its last name.
  v1::ListRequest paged;
  paged.set_prefix("old/");
  paged.set_page_size(std::numeric_limits<uint32_t>::max());
  response.Clear();
  status = list(paged, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_GT(response.tensors_size(), 0);
  EXPECT_LE(response.tensors_size(), 4096);
  EXPECT_LE(response.ByteSizeLong(), (size_t{1} << 20) + 1024);
  EXPECT_EQ(response.next_page_token(), response.tensors(response.tensors_size() - 1).name());
  paged.set_page_size(1);
  paged.set_page_token(response.next_page_token());
  const std::string resumed_after = response.next_page_token();
  response.Clear();
  status = list(paged, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.tensors_size(), 1);
  EXPECT_GT(response.tensors(0).name(), resumed_after);

  // Tokens no answer gave: refused, naming the prefix, never echoing a long token.
  for (const std::string& bad : {std::string("other/x"), std::string("old/../x"), std::string("old/a\0b", 7),
                                 "old/" + std::string(100000, 'a'), std::string("old")}) {
    paged.set_page_token(bad);
    response.Clear();
    status = list(paged, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.substr(0, 20);
    EXPECT_NE(status.error_message().find("page_token"), std::string::npos) << status.error_message();
    EXPECT_LT(status.error_message().size(), size_t{512});
  }
}

TEST(HostileDaemon, RaisesItsOwnOpenFileLimit) {
  rlimit ours{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &ours), 0);
  if (ours.rlim_max <= 256) GTEST_SKIP() << "the hard open-file limit is only " << ours.rlim_max;
  rlimit lowered = ours;
  lowered.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  DaemonProcess daemon;  // inherits the lowered soft limit
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &ours), 0);
  std::istringstream limits(ProcLine(daemon.pid(), "limits", "Max open files"));
  std::string soft, hard;
  limits >> soft >> hard;
  EXPECT_EQ(soft, hard) << "the daemon kept a soft open-file limit of " << soft;
  EXPECT_EQ(soft, ours.rlim_max == RLIM_INFINITY ? "unlimited" : std::to_string(ours.rlim_max));
}

}  // namespace
}  // namespace tensord
