// Hostile datagrams on the fd channel (hostile_fixture.h): garbage, truncated and oversized
// messages, wrong protocol versions, messages before HELLO, stray fds, too many staged fds
// and a peer that never reads. Each is refused with a clear error, every fd sent is closed,
// and the daemon's fd table is as it was.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "common/fd_channel.h"
#include "common/memory/host/memfd.h"
#include "common/unique_fd.h"
#include "gtest/gtest.h"
#include "tensord/v1/broker.grpc.pb.h"
#include "tensord/v1/fd_channel.pb.h"
#include "tests/integration/hostile_fixture.h"
#include "tests/integration/raw_wire.h"

namespace tensord {
namespace {

namespace v1 = tensord::v1;
using namespace std::chrono_literals;
using namespace testing;  // tensord::testing: HostileTest, the daemon fixture, the raw wire helpers

TEST_F(HostileTest, FdChannelGarbageTruncatedAndOversizedDatagramsAreRefused) {
  v1::StatusResponse baseline = GetStatus();
  int fds_before = StableFdCount(pid());
  {
    common::UniqueFd fd = ConnectFdChannel(daemon_->socket());
    ASSERT_TRUE(SendRaw(fd.get(), std::string(64, '\xff')));
    ExpectErrorThenClose(fd.get(), grpc::StatusCode::INVALID_ARGUMENT, "malformed", "garbage");
  }
  {
    common::UniqueFd fd = ConnectFdChannel(daemon_->socket());
    v1::FdRequest hello = HelloRequest();
    hello.mutable_hello()->set_client_name(std::string(200, 'c'));
    std::string bytes = Bytes(hello);
    ASSERT_TRUE(SendRaw(fd.get(), bytes.substr(0, bytes.size() / 2)));
    ExpectErrorThenClose(fd.get(), grpc::StatusCode::INVALID_ARGUMENT, "malformed", "truncated hello");
  }
  {
    common::UniqueFd fd = ConnectFdChannel(daemon_->socket());
    ASSERT_TRUE(SendRaw(fd.get(), std::string(100 * 1024, '\x01')));
    ExpectErrorThenClose(fd.get(), grpc::StatusCode::INVALID_ARGUMENT, "longer than", "100 kB datagram");
  }
  {
    // A HELLO just under the datagram limit is fine; the name is cut for display.
    common::UniqueFd fd = ConnectFdChannel(daemon_->socket());
    v1::FdRequest hello = HelloRequest();
    hello.mutable_hello()->set_client_name(std::string(60000, 'c'));
    ASSERT_TRUE(SendRaw(fd.get(), Bytes(hello)));
    FdReply reply = Receive(fd.get());
    ASSERT_EQ(reply.kind, FdReply::kMessage);
    EXPECT_TRUE(reply.response.has_welcome()) << reply.response.ShortDebugString().substr(0, 200);
  }
  {
    // An empty datagram reads as the peer closing: the session ends.
    RawSession session = OpenSession(daemon_->socket());
    ASSERT_TRUE(SendRaw(session.fd.get(), ""));
    EXPECT_EQ(Receive(session.fd.get()).kind, FdReply::kClosed);
  }
  EXPECT_EQ(SettledFdCount(pid(), fds_before), fds_before) << FdTargets(pid());
  ExpectIntact("fd-channel garbage", baseline);
}

TEST_F(HostileTest, FdChannelWrongVersionsAndMessagesBeforeHelloAreRefused) {
  v1::StatusResponse baseline = GetStatus();
  for (uint32_t version : {0u, common::kFdProtocolVersion - 1, common::kFdProtocolVersion + 1,
                           std::numeric_limits<uint32_t>::max()}) {
    common::UniqueFd fd = ConnectFdChannel(daemon_->socket());
    ASSERT_TRUE(SendRaw(fd.get(), Bytes(HelloRequest(version))));
    ExpectErrorThenClose(fd.get(), grpc::StatusCode::FAILED_PRECONDITION,
                         "protocol version " + std::to_string(version), "version " + std::to_string(version));
  }
  {
    common::UniqueFd fd = ConnectFdChannel(daemon_->socket());
    v1::FdRequest fetch;
    fetch.set_seq(3);
    fetch.mutable_fetch()->add_buffer_ids(1);
    ASSERT_TRUE(SendRaw(fd.get(), Bytes(fetch)));
    ExpectErrorThenClose(fd.get(), grpc::StatusCode::FAILED_PRECONDITION, "HELLO", "fetch before hello");
  }
  {
    common::UniqueFd fd = ConnectFdChannel(daemon_->socket());
    v1::FdRequest empty;
    empty.set_seq(9);
    ASSERT_TRUE(SendRaw(fd.get(), Bytes(empty)));
    ExpectErrorThenClose(fd.get(), grpc::StatusCode::FAILED_PRECONDITION, "HELLO", "empty before hello");
  }
  {
    RawSession session = OpenSession(daemon_->socket());
    v1::FdRequest empty;
    empty.set_seq(9);
    ASSERT_TRUE(SendRaw(session.fd.get(), Bytes(empty)));
    ExpectErrorThenClose(session.fd.get(), grpc::StatusCode::INVALID_ARGUMENT, "empty request", "empty request");
  }
  {
    RawSession session = OpenSession(daemon_->socket());
    ASSERT_TRUE(SendRaw(session.fd.get(), Bytes(HelloRequest())));
    ExpectErrorThenClose(session.fd.get(), grpc::StatusCode::FAILED_PRECONDITION, "twice", "second hello");
  }
  {
    // FETCH with too few or too many ids is refused but the session stays.
    RawSession session = OpenSession(daemon_->socket());
    v1::FdRequest fetch;
    fetch.set_seq(4);
    fetch.mutable_fetch();
    ASSERT_TRUE(SendRaw(session.fd.get(), Bytes(fetch)));
    FdReply none = Receive(session.fd.get());
    ASSERT_TRUE(none.response.has_error());
    EXPECT_EQ(none.response.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
    for (int i = 0; i < 5000; ++i) fetch.mutable_fetch()->add_buffer_ids(kU64Max - i);
    ASSERT_TRUE(SendRaw(session.fd.get(), Bytes(fetch)));
    FdReply many = Receive(session.fd.get());
    ASSERT_TRUE(many.response.has_error());
    EXPECT_EQ(many.response.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
    fetch.mutable_fetch()->clear_buffer_ids();
    fetch.mutable_fetch()->add_buffer_ids(kU64Max);
    ASSERT_TRUE(SendRaw(session.fd.get(), Bytes(fetch)));
    FdReply absent = Receive(session.fd.get());
    ASSERT_TRUE(absent.response.has_error());
    EXPECT_EQ(absent.response.error().code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(absent.response.seq(), 4u);
  }
  ExpectIntact("fd-channel protocol errors", baseline);
}

TEST_F(HostileTest, FdChannelStrayFdsAreClosedAndTheMessageRefused) {
  v1::StatusResponse baseline = GetStatus();
  int fds_before = StableFdCount(pid());
  auto memfd = common::CreateSealedMemfd("stray", 4096);
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  const int stray[3] = {memfd->get(), memfd->get(), STDERR_FILENO};
  {
    common::UniqueFd fd = ConnectFdChannel(daemon_->socket());
    ASSERT_TRUE(SendRaw(fd.get(), Bytes(HelloRequest()), stray));
    ExpectErrorThenClose(fd.get(), grpc::StatusCode::INVALID_ARGUMENT, "fd", "fds on hello");
  }
  {
    RawSession session = OpenSession(daemon_->socket());
    v1::FdRequest fetch;
    fetch.set_seq(2);
    fetch.mutable_fetch()->add_buffer_ids(1);
    ASSERT_TRUE(SendRaw(session.fd.get(), Bytes(fetch), std::span<const int>(stray, 1)));
    ExpectErrorThenClose(session.fd.get(), grpc::StatusCode::INVALID_ARGUMENT, "fd", "an fd on fetch");
  }
  {
    // The most SCM_RIGHTS allows in one message, on a STAGE that takes one.
    RawSession session = OpenSession(daemon_->socket());
    std::vector<int> many(common::kMaxFdsPerMessage, memfd->get());
    v1::FdRequest stage;
    stage.set_seq(3);
    stage.mutable_stage();
    ASSERT_TRUE(SendRaw(session.fd.get(), Bytes(stage), many));
    ExpectErrorThenClose(session.fd.get(), grpc::StatusCode::INVALID_ARGUMENT, "fds", "253 fds on stage");
  }
  {
    RawSession session = OpenSession(daemon_->socket());
    v1::FdRequest stage;
    stage.set_seq(3);
    stage.mutable_stage();
    ASSERT_TRUE(SendRaw(session.fd.get(), Bytes(stage)));
    ExpectErrorThenClose(session.fd.get(), grpc::StatusCode::INVALID_ARGUMENT, "0 fds", "stage without an fd");
  }
  // Every fd we sent was closed by the daemon: its table is as it was.
  EXPECT_EQ(SettledFdCount(pid(), fds_before), fds_before) << FdTargets(pid());
  ExpectIntact("stray fds", baseline);
}

TEST_F(HostileTest, FdChannelStagedFdsAreCappedAndGoWithTheSession) {
  GetStatus();  // so that our gRPC connection is part of the baseline
  int fds_before = StableFdCount(pid());
  RawSession session = OpenSession(daemon_->socket());
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  common::UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  v1::FdRequest stage;
  stage.mutable_stage();
  int staged = 0;
  FdReply reply;
  for (int i = 0; i < 100; ++i) {
    stage.set_seq(10 + i);
    ASSERT_TRUE(SendRaw(session.fd.get(), Bytes(stage), std::span<const int>(&pipe_fds[0], 1)));
    reply = Receive(session.fd.get());
    ASSERT_EQ(reply.kind, FdReply::kMessage);
    if (reply.response.has_error()) break;
    ++staged;
  }
  EXPECT_EQ(staged, 64);
  EXPECT_EQ(reply.response.error().code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << reply.response.error().message();
  // A staged pipe is no memfd: Export refuses it.
  v1::ExportRequest request;
  request.set_staged_fd_id(1);
  request.set_ns("ns");
  *request.mutable_desc() = Float32({4});
  grpc::ClientContext context;
  Authorize(context, session.token());
  v1::AllocateResponse response;
  grpc::Status exported = stub_->Export(&context, request, &response);
  EXPECT_EQ(CodeName(exported.error_code()), "FAILED_PRECONDITION") << exported.error_message();
  session.fd.reset();
  EXPECT_EQ(SettledFdCount(pid(), fds_before), fds_before) << "staged fds outlived their session\n" << FdTargets(pid());

  // A real memfd with a tensor placed past its end, or past 2^64: refused, nothing made.
  v1::StatusResponse baseline = GetStatus();
  RawSession exporter = OpenSession(daemon_->socket());
  auto memfd = common::CreateSealedMemfd("export", 4096);
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  const int memfd_number = memfd->get();
  for (uint64_t offset : {uint64_t{4096}, kU64Max - 8, kU64Max}) {
    stage.set_seq(offset);
    ASSERT_TRUE(SendRaw(exporter.fd.get(), Bytes(stage), std::span<const int>(&memfd_number, 1)));
    FdReply staged_memfd = Receive(exporter.fd.get());
    ASSERT_TRUE(staged_memfd.response.has_staged()) << staged_memfd.response.ShortDebugString();
    request.set_staged_fd_id(staged_memfd.response.staged().staged_fd_id());
    request.set_offset(offset);
    grpc::ClientContext export_context;
    Authorize(export_context, exporter.token());
    grpc::Status refused = stub_->Export(&export_context, request, &response);
    EXPECT_EQ(CodeName(refused.error_code()), "INVALID_ARGUMENT") << offset << ": " << refused.error_message();
  }
  ExpectIntact("exports past the end", baseline);
}

TEST_F(HostileTest, FdChannelPeerThatNeverReadsIsDisconnected) {
  RawSession session = OpenSession(daemon_->socket());
  timeval timeout{0, 200 * 1000};
  setsockopt(session.fd.get(), SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  v1::FdRequest fetch;
  fetch.set_seq(1);
  fetch.mutable_fetch()->add_buffer_ids(kU64Max);
  std::string bytes = Bytes(fetch);
  bool disconnected = false;
  auto deadline = std::chrono::steady_clock::now() + 20s;
  int sent = 0;
  while (!disconnected && std::chrono::steady_clock::now() < deadline) {
    if (SendRaw(session.fd.get(), bytes)) {
      ++sent;
      continue;
    }
    if (errno == EPIPE || errno == ECONNRESET) disconnected = true;
    // EAGAIN: the daemon stopped reading too; it must close us soon.
    pollfd pfd{session.fd.get(), POLLRDHUP, 0};
    if (poll(&pfd, 1, 100) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP))) disconnected = true;
  }
  EXPECT_TRUE(disconnected) << "after " << sent << " unread replies the daemon still had us";
  ASSERT_TRUE(Alive(pid()));
  EXPECT_TRUE(GetStatus().sessions() >= 1);
}

}  // namespace
}  // namespace tensord
