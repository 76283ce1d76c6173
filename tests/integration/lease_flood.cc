// tensord_lease_flood: holds a large number of leases in one process, for the load test.
// Speaks the wire protocol directly (fd-channel HELLO, then acquires pipelined on
// Session streams) so each acquire is one lease: the client library would share one
// remote lease per tensor.
//
//   tensord_lease_flood SOCKET SESSIONS LEASES_PER_SESSION NAME...
//
// Opens SESSIONS sessions; each acquires NAMEs round robin until it holds
// LEASES_PER_SESSION leases (keeping at most kWindow acquires in flight). Prints
// "held <total> in <ms> ms", then sleeps until killed (the kill is what releases them).
// On any error prints "error <what>" and exits 1.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/fd_channel.h"
#include "common/socket_paths.h"
#include "common/unique_fd.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "tensord/v1/broker.grpc.pb.h"
#include "tensord/v1/fd_channel.pb.h"

namespace {

constexpr uint64_t kWindow = 4096;

[[noreturn]] void Die(const std::string& what) {
  std::printf("error %s\n", what.c_str());
  std::fflush(stdout);
  std::exit(1);
}

struct FloodSession {
  tensord::common::UniqueFd fd_channel;  // the session lives as long as this socket
  std::string token;
};

FloodSession Hello(const std::string& socket_path) {
  auto socket = tensord::common::ConnectSeqpacket(tensord::common::FdChannelPath(socket_path));
  if (!socket.ok()) Die("connect: " + std::string(socket.status().message()));
  tensord::v1::FdRequest request;
  request.set_seq(1);
  request.mutable_hello()->set_protocol_version(tensord::common::kFdProtocolVersion);
  request.mutable_hello()->set_client_name("lease-flood");
  if (auto sent = tensord::common::SendFdMessage(socket->get(), request, {}); !sent.ok()) {
    Die("hello: " + std::string(sent.status().message()));
  }
  auto received = tensord::common::ReceiveFdMessage(socket->get(), 0);
  if (!received.ok()) Die("welcome: " + std::string(received.status().message()));
  tensord::v1::FdResponse response;
  if (auto parsed = tensord::common::ParseFdMessage(*received, &response); !parsed.ok()) {
    Die("welcome: " + std::string(parsed.message()));
  }
  if (!response.has_welcome()) Die("welcome: the broker answered " + response.ShortDebugString());
  return FloodSession{std::move(*socket), response.welcome().session_token()};
}

// Acquires `count` leases on one stream; returns how many were granted.
uint64_t Flood(tensord::v1::Broker::Stub* stub, const std::string& token,
               const std::vector<std::string>& names, uint64_t count) {
  grpc::ClientContext context;
  context.AddMetadata("tensord-session", token);
  auto stream = stub->Session(&context);
  uint64_t sent = 0;
  uint64_t granted = 0;
  tensord::v1::SessionResponse response;
  while (granted < count) {
    while (sent < count && sent - granted < kWindow) {
      tensord::v1::SessionRequest request;
      request.set_seq(sent + 1);
      request.mutable_acquire()->set_name(names[sent % names.size()]);
      if (!stream->Write(request)) Die("the session stream broke while writing");
      ++sent;
    }
    if (!stream->Read(&response)) Die("the session stream ended: " + stream->Finish().error_message());
    if (response.seq() == 0 && !response.has_batch()) continue;  // a push
    // Replies ready together come as one batch.
    std::vector<tensord::v1::SessionResponse> replies;
    if (response.has_batch()) {
      replies.assign(response.batch().responses().begin(), response.batch().responses().end());
    } else {
      replies.push_back(response);
    }
    for (const tensord::v1::SessionResponse& reply : replies) {
      if (reply.seq() == 0) continue;  // a push
      if (!reply.has_acquire()) Die("acquire: " + reply.ShortDebugString());
      ++granted;
    }
  }
  // The stream stays open (its loss releases nothing, but keep the process quiet).
  stream->WritesDone();
  while (stream->Read(&response)) {
  }
  stream->Finish();
  return granted;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: tensord_lease_flood SOCKET SESSIONS LEASES_PER_SESSION NAME...\n");
    return 2;
  }
  const std::string socket_path = argv[1];
  const int sessions = std::atoi(argv[2]);
  const uint64_t per_session = std::strtoull(argv[3], nullptr, 10);
  std::vector<std::string> names(argv + 4, argv + argc);

  auto channel = grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
  auto stub = tensord::v1::Broker::NewStub(channel);
  std::vector<FloodSession> held;
  for (int i = 0; i < sessions; ++i) held.push_back(Hello(socket_path));

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  std::vector<uint64_t> granted(held.size(), 0);
  for (size_t i = 0; i < held.size(); ++i) {
    threads.emplace_back([&, i] { granted[i] = Flood(stub.get(), held[i].token, names, per_session); });
  }
  uint64_t total = 0;
  for (size_t i = 0; i < threads.size(); ++i) {
    threads[i].join();
    total += granted[i];
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start).count();
  std::printf("held %llu in %lld ms\n", static_cast<unsigned long long>(total),
              static_cast<long long>(ms));
  std::fflush(stdout);
  while (true) pause();
}
