// Who may do what, attacked over raw gRPC and the fd channel (hostile_fixture.h): missing,
// forged, stale and oversized session tokens are UNAUTHENTICATED on every RPC and stream,
// and one session cannot release, fetch or publish what another holds.
#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
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

TEST_F(HostileTest, MissingForgedAndStaleTokensAreUnauthenticated) {
  v1::StatusResponse baseline = GetStatus();
  RawSession closed = OpenSession(daemon_->socket());
  std::string stale = closed.token();
  int sessions = static_cast<int>(GetStatus().sessions());
  closed.fd.reset();
  for (auto deadline = std::chrono::steady_clock::now() + 5s;
       static_cast<int>(GetStatus().sessions()) >= sessions && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(5ms);
  }
  std::string forged(32, '0');
  std::string flipped = token();
  flipped[0] = flipped[0] == 'a' ? 'b' : 'a';
  std::vector<std::pair<std::string, const std::string*>> tokens = {
      {"missing", nullptr}, {"forged", &forged}, {"one digit off", &flipped}, {"stale", &stale}};
  std::string long_token(4000, 'f');
  tokens.emplace_back("4 kB", &long_token);
  std::string empty;
  tokens.emplace_back("empty", &empty);
  for (const auto& [label, bad] : tokens) {
    for (const std::string& method : UnaryMethods()) {
      grpc::Status status = RawUnary(*generic_, method, "", bad);
      EXPECT_EQ(CodeName(status.error_code()), "UNAUTHENTICATED") << label << " token, " << method;
      EXPECT_EQ(status.error_message().find(token()), std::string::npos);
    }
    for (const std::string& method : {std::string("Session"), std::string("Watch")}) {
      grpc::Status status = RawStream(*generic_, method, {""}, bad);
      EXPECT_EQ(CodeName(status.error_code()), "UNAUTHENTICATED") << label << " token, " << method;
    }
  }
  // Metadata beyond gRPC's own limit is refused by gRPC, never UNKNOWN or OK. gRPC drops
  // the whole connection for it, so this goes on a connection of its own: channels with
  // the same target and arguments share gRPC's global subchannel pool, and so would share
  // channel_'s connection (a call of ours then racing the drop fails with "Socket closed").
  std::string huge(100000, 'f');
  grpc::ChannelArguments own_args;
  own_args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto own_channel =
      grpc::CreateCustomChannel("unix:" + daemon_->socket(), grpc::InsecureChannelCredentials(), own_args);
  grpc::GenericStub own_stub(own_channel);
  grpc::Status status = RawUnary(own_stub, "Status", "", &huge);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.error_code(), grpc::StatusCode::UNKNOWN) << status.error_message();
  ExpectIntact("bad tokens", baseline);
}

TEST_F(HostileTest, AnotherSessionsLeasesCannotBeReleasedFetchedOrPublished) {
  RawSession owner = OpenSession(daemon_->socket());
  v1::TensorInfo tensor = Publish(owner, "ns/x", 1024);
  auto lease = Acquire(owner, "ns/x");
  ASSERT_TRUE(lease.ok()) << lease.status();
  v1::StatusResponse baseline = GetStatus();

  RawSession thief = OpenSession(daemon_->socket());
  v1::ReleaseResponse stolen = Release(thief, {lease->lease_id()});
  EXPECT_EQ(stolen.released(), 0u);
  ASSERT_EQ(stolen.not_found_size(), 1);
  EXPECT_EQ(stolen.not_found(0), lease->lease_id());
  v1::StatusResponse after = GetStatus();
  EXPECT_EQ(after.leases(), baseline.leases()) << "the owner's lease was released by another session";
  EXPECT_EQ(after.releases_not_found(), baseline.releases_not_found() + 1);

  // The thief cannot fetch the buffer's fd either (the same answer as for no buffer).
  v1::FdRequest fetch;
  fetch.set_seq(2);
  fetch.mutable_fetch()->add_buffer_ids(tensor.buffer().buffer_id());
  ASSERT_TRUE(SendRaw(thief.fd.get(), Bytes(fetch)));
  FdReply reply = Receive(thief.fd.get());
  ASSERT_EQ(reply.kind, FdReply::kMessage);
  EXPECT_TRUE(reply.fds.empty());
  ASSERT_TRUE(reply.response.has_error());
  EXPECT_EQ(reply.response.error().code(), grpc::StatusCode::NOT_FOUND);

  // Nor publish a tensor another session is creating.
  v1::AllocateRequest allocate;
  allocate.set_ns("ns");
  *allocate.mutable_desc() = Float32({0});
  grpc::ClientContext allocate_context;
  Authorize(allocate_context, owner.token());
  v1::AllocateResponse allocated;
  ASSERT_TRUE(stub_->Allocate(&allocate_context, allocate, &allocated).ok());
  v1::PublishRequest publish;
  publish.set_tensor_id(allocated.tensor().tensor_id());
  publish.set_name("ns/hijacked");
  grpc::ClientContext publish_context;
  Authorize(publish_context, thief.token());
  v1::PublishResponse published;
  EXPECT_EQ(CodeName(stub_->Publish(&publish_context, publish, &published).error_code()), "NOT_FOUND");

  // The owner still holds its lease and releases it.
  EXPECT_EQ(Release(owner, {lease->lease_id()}).released(), 1u);
}

}  // namespace
}  // namespace tensord
