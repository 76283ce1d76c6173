// HostileTest: a fresh `tensord` per test and the means to attack it over raw gRPC (the
// generated stub, and a generic stub for bytes that are no message at all), plus what the
// hostile tests check after each group of requests: every request gets a clear status (never
// UNKNOWN), the daemon never crashes, and nothing is left half-registered (the Status
// counters are what they were).
//
// The hostile tests speak the wire protocol themselves, so they link the generated code and
// tensord_common, never libtensord.so (which carries its own copy of the generated code).
// Header-only, like the daemon fixture and the raw wire helpers it builds on; a test binary
// that includes it from several files shares one HostileTest.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/memory/host/memfd.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tensord/v1/broker.grpc.pb.h"
#include "tensord/v1/fd_channel.pb.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/raw_wire.h"

namespace tensord::testing {

// ---------------------------------------------------------------------------------------
// gRPC helpers.

inline const std::vector<std::string>& UnaryMethods() {
  static const std::vector<std::string> methods = {
      "Allocate", "Export", "Publish", "Acquire", "Take", "Release", "Delete", "List", "Stat", "Status",
      "HandOver"};
  return methods;
}

inline std::string Method(const std::string& name) { return "/tensord.v1.Broker/" + name; }

inline grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

inline void SetToken(grpc::ClientContext& context, const std::string* token, std::chrono::milliseconds deadline) {
  if (token != nullptr) context.AddMetadata(kTokenKey, *token);
  context.set_deadline(std::chrono::system_clock::now() + deadline);
}

// A unary call whose request body is `bytes` exactly.
inline grpc::Status RawUnary(grpc::GenericStub& stub, const std::string& method, const std::string& bytes,
                             const std::string* token, std::chrono::milliseconds deadline = 3s) {
  grpc::ClientContext context;
  SetToken(context, token, deadline);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&context, Method(method), ToByteBuffer(bytes), &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// A streaming call (Session or Watch) that writes `messages` verbatim, half-closes and
// reads whatever comes back. `replies` counts the messages read.
inline grpc::Status RawStream(grpc::GenericStub& stub, const std::string& method,
                              const std::vector<std::string>& messages, const std::string* token,
                              int* replies = nullptr, std::chrono::milliseconds deadline = 3s) {
  grpc::ClientContext context;
  SetToken(context, token, deadline);
  grpc::CompletionQueue cq;
  void* tag;
  bool ok = false;
  auto call = stub.PrepareCall(&context, Method(method), &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  bool open = ok;
  for (const std::string& message : messages) {
    if (!open) break;
    call->Write(ToByteBuffer(message), reinterpret_cast<void*>(2));
    cq.Next(&tag, &open);
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
  }
  int read = 0;
  while (true) {
    grpc::ByteBuffer buffer;
    call->Read(&buffer, reinterpret_cast<void*>(4));
    if (!cq.Next(&tag, &ok) || !ok) break;
    ++read;
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (replies != nullptr) *replies = read;
  return status;
}

class HostileTest : public ::testing::Test {
 protected:
  void SetUp() override { StartDaemon({}); }

  void StartDaemon(std::vector<std::string> args) {
    daemon_ = std::make_unique<DaemonProcess>(std::move(args));
    channel_ = grpc::CreateChannel("unix:" + daemon_->socket(), grpc::InsecureChannelCredentials());
    stub_ = v1::Broker::NewStub(channel_);
    generic_ = std::make_unique<grpc::GenericStub>(channel_);
    session_ = OpenSession(daemon_->socket());
  }

  pid_t pid() const { return daemon_->pid(); }
  const std::string& token() const { return session_.token(); }

  void Authorize(grpc::ClientContext& context, const std::string& token, std::chrono::milliseconds deadline = 10s) {
    context.AddMetadata(kTokenKey, token);
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    // gRPC closes a connection for some hostile calls (oversized metadata, undecodable
    // frames); a call of ours that races the reconnect waits for it instead of failing.
    context.set_wait_for_ready(true);
  }

  v1::StatusResponse GetStatus(const v1::StatusRequest& request = {}) {
    grpc::ClientContext context;
    Authorize(context, token());
    v1::StatusResponse response;
    grpc::Status status = stub_->Status(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  // Polls the status until `session` has `waiting` acquires and takes waiting at the
  // broker, or 10 s pass; the failure says what was seen last.
  ::testing::AssertionResult WaitForWaiting(const RawSession& session, uint64_t waiting) {
    v1::StatusRequest request;
    request.set_include_sessions(true);
    std::string seen = "session not listed";
    for (auto deadline = std::chrono::steady_clock::now() + 10s;;) {
      const v1::StatusResponse status = GetStatus(request);
      for (const v1::SessionUsage& usage : status.session_usage()) {
        if (usage.id() != session.welcome.session_id()) continue;
        if (usage.waiting() == waiting) return ::testing::AssertionSuccess();
        seen = std::to_string(usage.waiting()) + " waiting";
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return ::testing::AssertionFailure() << "session " << session.welcome.session_id() << " never had "
                                             << waiting << " waiting at the broker in 10 s; last seen: " << seen;
      }
      std::this_thread::sleep_for(2ms);
    }
  }

  // The daemon is alive and serving, and nothing was registered or leaked since the baseline.
  void ExpectIntact(const std::string& after, const v1::StatusResponse& baseline) {
    ASSERT_TRUE(Alive(pid())) << "tensord died after " << after;
    v1::StatusResponse now = GetStatus();
    EXPECT_EQ(now.tensors(), baseline.tensors()) << after;
    EXPECT_EQ(now.named_tensors(), baseline.named_tensors()) << after;
    EXPECT_EQ(now.buffers(), baseline.buffers()) << after;
    EXPECT_EQ(now.leases(), baseline.leases()) << after;
    EXPECT_EQ(now.host_bytes_in_use(), baseline.host_bytes_in_use()) << after;
    // And a new client is served as before.
    RawSession fresh = OpenSession(daemon_->socket());
    EXPECT_FALSE(fresh.token().empty()) << after;
  }

  // Allocates float32[count] in the name's namespace, seals it and publishes it; the
  // producer's lease is released, so only the binding holds it.
  v1::TensorInfo Publish(RawSession& session, const std::string& name, int64_t count) {
    v1::AllocateRequest allocate;
    allocate.set_ns(name.substr(0, name.find('/')));
    *allocate.mutable_desc() = Float32({count});
    v1::AllocateResponse allocated;
    {
      grpc::ClientContext context;
      Authorize(context, session.token());
      grpc::Status status = stub_->Allocate(&context, allocate, &allocated);
      EXPECT_TRUE(status.ok()) << status.error_message();
    }
    if (uint64_t buffer = allocated.tensor().buffer().buffer_id(); buffer != 0) {
      v1::FdRequest fetch;
      fetch.set_seq(7);
      fetch.mutable_fetch()->add_buffer_ids(buffer);
      EXPECT_TRUE(SendRaw(session.fd.get(), Bytes(fetch)));
      FdReply reply = Receive(session.fd.get());
      EXPECT_EQ(reply.fds.size(), 1u) << reply.response.ShortDebugString();
      if (reply.fds.size() == 1) {
        EXPECT_TRUE(common::SealFutureWrite(reply.fds[0].get(), "test").ok());
      }
    }
    v1::PublishRequest publish;
    publish.set_tensor_id(allocated.tensor().tensor_id());
    publish.set_name(name);
    v1::PublishResponse published;
    {
      grpc::ClientContext context;
      Authorize(context, session.token());
      grpc::Status status = stub_->Publish(&context, publish, &published);
      EXPECT_TRUE(status.ok()) << status.error_message();
    }
    Release(session, {allocated.lease_id()});
    return published.tensor();
  }

  v1::ReleaseResponse Release(RawSession& session, std::vector<uint64_t> leases) {
    v1::ReleaseRequest request;
    for (uint64_t id : leases) request.add_lease_ids(id);
    grpc::ClientContext context;
    Authorize(context, session.token());
    v1::ReleaseResponse response;
    grpc::Status status = stub_->Release(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  absl::StatusOr<v1::AcquireResponse> Acquire(RawSession& session, const std::string& name) {
    v1::AcquireRequest request;
    request.set_name(name);
    grpc::ClientContext context;
    Authorize(context, session.token());
    v1::AcquireResponse response;
    grpc::Status status = stub_->Acquire(&context, request, &response);
    if (!status.ok()) return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    return response;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Broker::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_;
  RawSession session_;
};

// One hostile unary request and what it must get back.
struct Case {
  std::string label;
  grpc::StatusCode code;
  std::string text;  // part of the message ("" = anything)
  std::function<grpc::Status(grpc::ClientContext*)> call;
};

inline void RunCases(const std::vector<Case>& cases, const std::string& token) {
  for (const Case& c : cases) {
    grpc::ClientContext context;
    context.AddMetadata(kTokenKey, token);
    context.set_deadline(std::chrono::system_clock::now() + 10s);
    grpc::Status status = c.call(&context);
    EXPECT_EQ(CodeName(status.error_code()), CodeName(c.code)) << c.label << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(c.text), std::string::npos) << c.label << ": " << status.error_message();
    EXPECT_LT(status.error_message().size(), 2048u) << c.label << ": the message echoes the request";
  }
}

// What a body that does not decode gets: INVALID_ARGUMENT naming the message type.
inline void ExpectUndecodable(const grpc::Status& status, const std::string& what) {
  EXPECT_EQ(CodeName(status.error_code()), "INVALID_ARGUMENT") << what << ": " << status.error_message();
  EXPECT_NE(status.error_message().find("does not decode as tensord.v1."), std::string::npos)
      << what << ": " << status.error_message();
}

}  // namespace tensord::testing
