// Hostile clients against the real `tensord`: raw gRPC (the generated stub, and a generic
// stub for bytes that are no message at all) and raw fd-channel datagrams. Every request
// gets a clear status (never UNKNOWN), the daemon never crashes, and nothing is left
// half-registered: after each group the Status counters are what they were.
//
// This binary speaks the wire protocol itself, so it links the generated code and
// tensord_common, never libtensord.so (which carries its own copy of the generated code).
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/memory/host/memfd.h"
#include "common/unique_fd.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tensord/v1/broker.grpc.pb.h"
#include "tensord/v1/fd_channel.pb.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/raw_wire.h"
#include "tests/integration/sanitizers.h"

namespace tensord {
namespace {

namespace v1 = tensord::v1;
using namespace std::chrono_literals;
using namespace testing;  // tensord::testing: the daemon fixture and the raw wire helpers

// ---------------------------------------------------------------------------------------
// gRPC helpers.

const std::vector<std::string>& UnaryMethods() {
  static const std::vector<std::string> methods = {
      "Allocate", "Export", "Publish", "Acquire", "Take", "Release", "Delete", "List", "Stat", "Status",
      "HandOver"};
  return methods;
}

std::string Method(const std::string& name) { return "/tensord.v1.Broker/" + name; }

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

void SetToken(grpc::ClientContext& context, const std::string* token, std::chrono::milliseconds deadline) {
  if (token != nullptr) context.AddMetadata(kTokenKey, *token);
  context.set_deadline(std::chrono::system_clock::now() + deadline);
}

// A unary call whose request body is `bytes` exactly.
grpc::Status RawUnary(grpc::GenericStub& stub, const std::string& method, const std::string& bytes,
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
grpc::Status RawStream(grpc::GenericStub& stub, const std::string& method,
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

// Under a sanitizer the daemon is several times slower and ASan keeps freed memory in
// quarantine, so bounds on resident memory and on timing do not hold there; those checks
// run in the regular build.
using testing::kSanitized;

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

void RunCases(const std::vector<Case>& cases, const std::string& token) {
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
void ExpectUndecodable(const grpc::Status& status, const std::string& what) {
  EXPECT_EQ(CodeName(status.error_code()), "INVALID_ARGUMENT") << what << ": " << status.error_message();
  EXPECT_NE(status.error_message().find("does not decode as tensord.v1."), std::string::npos)
      << what << ": " << status.error_message();
}

// ---------------------------------------------------------------------------------------
// gRPC

TEST_F(HostileTest, RandomBytesToEveryRpcGetAClearStatus) {
  v1::StatusResponse baseline = GetStatus();
  std::mt19937_64 random(20261121);
  // Known undecodable bodies first: a bad wire type, a truncated varint, a length past the end.
  std::vector<std::string> undecodable = {std::string("\x0f", 1), std::string("\x08\xff", 2),
                                          std::string("\x12\xff\xff\x03", 4), std::string(64, '\xff')};
  std::map<std::string, int> seen;
  for (const std::string& method : UnaryMethods()) {
    for (const std::string& bytes : undecodable) {
      grpc::Status status = RawUnary(*generic_, method, bytes, &token());
      ExpectUndecodable(status, method);
    }
    for (int i = 0; i < 24; ++i) {
      std::string bytes(16 + random() % 2048, '\0');
      for (char& c : bytes) c = static_cast<char>(random());
      grpc::Status status = RawUnary(*generic_, method, bytes, &token(), 2s);
      ++seen[CodeName(status.error_code())];
      EXPECT_NE(status.error_code(), grpc::StatusCode::UNKNOWN) << method << ": " << status.error_message();
      if (method != "Acquire" && method != "Take") {
        EXPECT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << method;
      }
      ASSERT_TRUE(Alive(pid())) << method;
    }
  }
  for (const std::string& method : {std::string("Session"), std::string("Watch")}) {
    for (const std::string& bytes : undecodable) {
      grpc::Status status = RawStream(*generic_, method, {bytes}, &token());
      ExpectUndecodable(status, method);
    }
  }
  // A valid Session request and then garbage: the first is answered, then the stream ends
  // with INVALID_ARGUMENT (not OK, as if the client had closed it cleanly).
  v1::SessionRequest acquire_absent;
  acquire_absent.set_seq(1);
  acquire_absent.mutable_acquire()->set_name("ns/absent");
  int replies = 0;
  grpc::Status mixed = RawStream(*generic_, "Session", {acquire_absent.SerializeAsString(), std::string(64, '\xff')},
                                 &token(), &replies);
  ExpectUndecodable(mixed, "Session after a valid request");
  EXPECT_GE(replies, 1);  // the answer, maybe after a cache_reset owed since an earlier stream
  std::string summary;
  for (const auto& [code, count] : seen) summary += code + "=" + std::to_string(count) + " ";
  RecordProperty("random_body_statuses", summary);
  ExpectIntact("random request bodies", baseline);
}

TEST_F(HostileTest, ExtremeIntegersHugeFieldsAndUnknownEnumsGetClearStatuses) {
  v1::StatusResponse baseline = GetStatus();
  auto allocate = [this](v1::AllocateRequest request) {
    return [this, request](grpc::ClientContext* context) {
      v1::AllocateResponse response;
      return stub_->Allocate(context, request, &response);
    };
  };
  auto with_desc = [](v1::TensorDesc desc) {
    v1::AllocateRequest request;
    request.set_ns("ns");
    *request.mutable_desc() = std::move(desc);
    return request;
  };
  std::vector<Case> cases;
  cases.push_back({"shape int64 max", grpc::StatusCode::INVALID_ARGUMENT, "desc.shape",
                   allocate(with_desc(Float32({std::numeric_limits<int64_t>::max()})))});
  cases.push_back({"shape -1", grpc::StatusCode::INVALID_ARGUMENT, "desc.shape[1]",
                   allocate(with_desc(Float32({4, -1})))});
  cases.push_back({"shape int64 min", grpc::StatusCode::INVALID_ARGUMENT, "desc.shape[0]",
                   allocate(with_desc(Float32({std::numeric_limits<int64_t>::min()})))});
  cases.push_back({"1e5 dims", grpc::StatusCode::INVALID_ARGUMENT, "100000 dimensions",
                   allocate(with_desc(Float32(std::vector<int64_t>(100000, 1))))});
  {
    v1::TensorDesc desc = Float32({4, 4});
    desc.add_strides(std::numeric_limits<int64_t>::min());
    desc.add_strides(1);
    cases.push_back({"stride int64 min", grpc::StatusCode::INVALID_ARGUMENT, "desc.strides[0]", allocate(with_desc(desc))});
    desc.set_strides(0, std::numeric_limits<int64_t>::max());
    cases.push_back({"stride int64 max", grpc::StatusCode::INVALID_ARGUMENT, "desc.strides[0]", allocate(with_desc(desc))});
    desc = Float32({4});
    desc.set_byte_offset(kU64Max);
    cases.push_back({"byte_offset max", grpc::StatusCode::INVALID_ARGUMENT, "desc.byte_offset", allocate(with_desc(desc))});
    desc = Float32({4});
    desc.mutable_dtype()->set_code(static_cast<v1::DTypeCode>(200));
    cases.push_back({"dtype code 200", grpc::StatusCode::INVALID_ARGUMENT, "desc.dtype", allocate(with_desc(desc))});
    desc = Float32({4});
    desc.mutable_dtype()->set_bits(std::numeric_limits<uint32_t>::max());
    cases.push_back({"dtype bits max", grpc::StatusCode::INVALID_ARGUMENT, "desc.dtype", allocate(with_desc(desc))});
    desc = Float32({4});
    desc.mutable_dtype()->set_lanes(0);
    cases.push_back({"lanes 0", grpc::StatusCode::INVALID_ARGUMENT, "desc.dtype", allocate(with_desc(desc))});
    desc = Float32({4});
    desc.mutable_device()->set_type(static_cast<v1::DeviceType>(99));
    cases.push_back({"device type 99", grpc::StatusCode::INVALID_ARGUMENT, "desc.device.type", allocate(with_desc(desc))});
    desc = Float32({4});
    desc.mutable_device()->set_index(std::numeric_limits<int32_t>::min());
    cases.push_back({"device index min", grpc::StatusCode::INVALID_ARGUMENT, "desc.device.index", allocate(with_desc(desc))});
    desc = Float32({4});
    desc.mutable_device()->set_uuid(std::string(100000, 'u'));
    cases.push_back({"uuid 100 kB", grpc::StatusCode::INVALID_ARGUMENT, "desc.device.uuid", allocate(with_desc(desc))});
    desc = Float32({4});
    desc.mutable_device()->set_type(v1::DEVICE_TYPE_CUDA);
    // Unavailable here (no driver), or not built: either way the message says which backend.
    cases.push_back({"cuda without a GPU", grpc::StatusCode::FAILED_PRECONDITION, "cuda backend", allocate(with_desc(desc))});
    // 2^48 floats = 1 PiB: a valid description, far over the quota.
    cases.push_back({"1 PiB", grpc::StatusCode::RESOURCE_EXHAUSTED, "--max-host-bytes",
                     allocate(with_desc(Float32({int64_t{1} << 24, int64_t{1} << 24})))});
  }
  {
    v1::AllocateRequest request = with_desc(Float32({4}));
    request.set_ns(std::string(100000, 'n'));
    cases.push_back({"ns 100 kB", grpc::StatusCode::INVALID_ARGUMENT, "namespace", allocate(request)});
    request = with_desc(Float32({4}));
    for (int i = 0; i < 100000; ++i) {
      // insert(), not operator[]= "v": GCC 12 warns falsely (-Wrestrict) on that.
      request.mutable_tags()->insert({absl::StrCat("k", i), std::string(1, 'v')});
    }
    cases.push_back({"1e5 tags", grpc::StatusCode::INVALID_ARGUMENT, "tags", allocate(request)});
    request = with_desc(Float32({4}));
    (*request.mutable_tags())[std::string(100000, 'k')] = "v";
    cases.push_back({"100 kB tag key", grpc::StatusCode::INVALID_ARGUMENT, "tags", allocate(request)});
    request = with_desc(Float32({4}));
    (*request.mutable_tags())["k"] = std::string(100000, 'v');
    cases.push_back({"100 kB tag value", grpc::StatusCode::INVALID_ARGUMENT, "tags", allocate(request)});
  }
  for (uint64_t id : {uint64_t{0}, kU64Max}) {
    v1::ExportRequest request;
    request.set_staged_fd_id(id);
    request.set_offset(kU64Max);
    request.set_ns("ns");
    *request.mutable_desc() = Float32({4});
    cases.push_back({"export staged id " + std::to_string(id), grpc::StatusCode::NOT_FOUND, "staged fd",
                     [this, request](grpc::ClientContext* context) {
                       v1::AllocateResponse response;
                       return stub_->Export(context, request, &response);
                     }});
    v1::PublishRequest publish;
    publish.set_tensor_id(id);
    publish.set_name("ns/x");
    publish.set_ttl_ms(kU64Max);
    publish.set_if_generation(kU64Max);
    cases.push_back({"publish tensor " + std::to_string(id), grpc::StatusCode::NOT_FOUND, "tensor",
                     [this, publish](grpc::ClientContext* context) {
                       v1::PublishResponse response;
                       return stub_->Publish(context, publish, &response);
                     }});
    v1::AcquireRequest acquire;
    acquire.set_tensor_id(id);
    cases.push_back({"acquire tensor " + std::to_string(id), grpc::StatusCode::NOT_FOUND, "",
                     [this, acquire](grpc::ClientContext* context) {
                       v1::AcquireResponse response;
                       return stub_->Acquire(context, acquire, &response);
                     }});
    v1::StatRequest stat;
    stat.set_tensor_id(id);
    cases.push_back({"stat tensor " + std::to_string(id), grpc::StatusCode::NOT_FOUND, "",
                     [this, stat](grpc::ClientContext* context) {
                       v1::StatResponse response;
                       return stub_->Stat(context, stat, &response);
                     }});
    v1::HandOverRequest hand_over;
    hand_over.set_lease_id(id);
    cases.push_back({"hand over lease " + std::to_string(id), grpc::StatusCode::NOT_FOUND, "holds no lease",
                     [this, hand_over](grpc::ClientContext* context) {
                       v1::HandOverResponse response;
                       return stub_->HandOver(context, hand_over, &response);
                     }});
    v1::DeleteRequest remove;
    remove.set_name("ns/absent");
    remove.set_if_generation(id);
    cases.push_back({"delete if_generation " + std::to_string(id), grpc::StatusCode::NOT_FOUND, "ns/absent",
                     [this, remove](grpc::ClientContext* context) {
                       v1::DeleteResponse response;
                       return stub_->Delete(context, remove, &response);
                     }});
  }
  {
    v1::AcquireRequest acquire;
    acquire.set_name("ns/absent");
    acquire.set_min_generation(kU64Max);
    cases.push_back({"acquire min_generation max", grpc::StatusCode::NOT_FOUND, "ns/absent",
                     [this, acquire](grpc::ClientContext* context) {
                       v1::AcquireResponse response;
                       return stub_->Acquire(context, acquire, &response);
                     }});
    cases.push_back({"acquire without a target", grpc::StatusCode::INVALID_ARGUMENT, "a tensor_id or a hand_over token",
                     [this](grpc::ClientContext* context) {
                       v1::AcquireResponse response;
                       return stub_->Acquire(context, v1::AcquireRequest(), &response);
                     }});
    v1::AcquireRequest forged;
    forged.set_hand_over(std::string(1 << 20, 'f'));  // no token is a megabyte, or made up
    cases.push_back({"acquire a forged hand-over", grpc::StatusCode::NOT_FOUND, "no such hand-over",
                     [this, forged](grpc::ClientContext* context) {
                       v1::AcquireResponse response;
                       return stub_->Acquire(context, forged, &response);
                     }});
    v1::HandOverRequest forever;
    forever.set_lease_id(1);
    forever.set_ttl_ms(kU64Max);
    cases.push_back({"hand over for ever", grpc::StatusCode::INVALID_ARGUMENT, "one hour",
                     [this, forever](grpc::ClientContext* context) {
                       v1::HandOverResponse response;
                       return stub_->HandOver(context, forever, &response);
                     }});
    cases.push_back({"stat without a target", grpc::StatusCode::INVALID_ARGUMENT, "name or a tensor_id",
                     [this](grpc::ClientContext* context) {
                       v1::StatResponse response;
                       return stub_->Stat(context, v1::StatRequest(), &response);
                     }});
    cases.push_back({"take nothing", grpc::StatusCode::INVALID_ARGUMENT, "",
                     [this](grpc::ClientContext* context) {
                       v1::AcquireResponse response;
                       return stub_->Take(context, v1::TakeRequest(), &response);
                     }});
  }
  {
    v1::ReleaseRequest release;
    for (int i = 0; i < 1000000; ++i) release.add_lease_ids(kU64Max - static_cast<uint64_t>(i));
    cases.push_back({"release 1e6 ids", grpc::StatusCode::INVALID_ARGUMENT, "65536",
                     [this, release](grpc::ClientContext* context) {
                       v1::ReleaseResponse response;
                       return stub_->Release(context, release, &response);
                     }});
  }
  RunCases(cases, token());
  ExpectIntact("extreme values", baseline);

  // The largest batch allowed is answered in full and counted.
  v1::ReleaseRequest release;
  for (int i = 0; i < 65536; ++i) release.add_lease_ids(kU64Max - static_cast<uint64_t>(i));
  grpc::ClientContext context;
  Authorize(context, token());
  v1::ReleaseResponse response;
  ASSERT_TRUE(stub_->Release(&context, release, &response).ok());
  EXPECT_EQ(response.released(), 0u);
  EXPECT_EQ(response.not_found_size(), 65536);
  EXPECT_EQ(GetStatus().releases_not_found(), baseline.releases_not_found() + 65536);
}

TEST_F(HostileTest, ExtremeButValidTimeoutsAndTtlsBehave) {
  // A timeout past the clock's range waits (until our own deadline), it does not expire at once.
  v1::AcquireRequest acquire;
  acquire.set_name("ns/later");
  acquire.set_timeout_ms(kU64Max);
  grpc::ClientContext context;
  Authorize(context, token(), 300ms);
  v1::AcquireResponse response;
  auto start = std::chrono::steady_clock::now();
  grpc::Status status = stub_->Acquire(&context, acquire, &response);
  EXPECT_EQ(CodeName(status.error_code()), "DEADLINE_EXCEEDED") << status.error_message();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms) << "the daemon gave up at once";

  // The same wait on the Session stream, then the tensor appears and the wait completes.
  grpc::ClientContext stream_context;
  Authorize(stream_context, token());
  auto stream = stub_->Session(&stream_context);
  v1::SessionRequest request;
  request.set_seq(kU64Max);
  *request.mutable_acquire() = acquire;
  // The unary wait went when its call was cancelled; then the stream's wait is the one
  // counted, and the publish comes only once it waits.
  ASSERT_TRUE(WaitForWaiting(session_, 0));
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(WaitForWaiting(session_, 1));
  RawSession producer = OpenSession(daemon_->socket());
  v1::TensorInfo published = Publish(producer, "ns/later", 16);
  v1::SessionResponse reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.seq(), kU64Max);
  ASSERT_TRUE(reply.has_acquire()) << reply.ShortDebugString();
  EXPECT_EQ(reply.acquire().tensor().tensor_id(), published.tensor_id());
  stream_context.TryCancel();

  // A TTL past the clock's range keeps the binding.
  v1::AllocateRequest allocate;
  allocate.set_ns("ns");
  *allocate.mutable_desc() = Float32({0});
  grpc::ClientContext allocate_context;
  Authorize(allocate_context, producer.token());
  v1::AllocateResponse allocated;
  ASSERT_TRUE(stub_->Allocate(&allocate_context, allocate, &allocated).ok());
  v1::PublishRequest publish;
  publish.set_tensor_id(allocated.tensor().tensor_id());
  publish.set_name("ns/forever");
  publish.set_ttl_ms(kU64Max);
  grpc::ClientContext publish_context;
  Authorize(publish_context, producer.token());
  v1::PublishResponse publish_response;
  ASSERT_TRUE(stub_->Publish(&publish_context, publish, &publish_response).ok());
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(Acquire(session_, "ns/forever").ok());
}

TEST_F(HostileTest, SessionStreamOpsWithHostileValuesGetErrorReplies) {
  v1::StatusResponse baseline = GetStatus();
  grpc::ClientContext context;
  Authorize(context, token());
  auto stream = stub_->Session(&context);
  std::vector<std::pair<v1::SessionRequest, grpc::StatusCode>> requests;
  auto add = [&](grpc::StatusCode code, auto fill) {
    v1::SessionRequest request;
    request.set_seq(requests.size() + 1);
    fill(request);
    requests.emplace_back(std::move(request), code);
  };
  add(grpc::StatusCode::INVALID_ARGUMENT, [](v1::SessionRequest&) {});  // no operation
  add(grpc::StatusCode::INVALID_ARGUMENT, [](v1::SessionRequest& r) { r.mutable_acquire()->set_name(std::string(100000, 'a')); });
  add(grpc::StatusCode::INVALID_ARGUMENT, [](v1::SessionRequest& r) { r.mutable_acquire()->set_name("ns/../x"); });
  add(grpc::StatusCode::NOT_FOUND, [](v1::SessionRequest& r) { r.mutable_acquire()->set_tensor_id(kU64Max); });
  add(grpc::StatusCode::INVALID_ARGUMENT, [](v1::SessionRequest& r) { r.mutable_take()->set_name_or_prefix("/"); });
  add(grpc::StatusCode::NOT_FOUND, [](v1::SessionRequest& r) { r.mutable_take()->set_name_or_prefix("q/"); });
  add(grpc::StatusCode::NOT_FOUND, [](v1::SessionRequest& r) { r.mutable_publish()->set_tensor_id(kU64Max); });
  add(grpc::StatusCode::INVALID_ARGUMENT, [](v1::SessionRequest& r) {
    r.mutable_publish()->set_tensor_id(1);
    r.mutable_publish()->set_name(std::string("ns/a\0b", 6));
  });
  add(grpc::StatusCode::INVALID_ARGUMENT, [](v1::SessionRequest& r) {
    for (int i = 0; i < 70000; ++i) r.mutable_release()->add_lease_ids(i);
  });
  add(grpc::StatusCode::OK, [](v1::SessionRequest& r) { r.mutable_release()->add_lease_ids(kU64Max); });
  for (const auto& [request, code] : requests) ASSERT_TRUE(stream->Write(request));
  // A release without seq wants no reply, even when refused.
  v1::SessionRequest silent;
  for (int i = 0; i < 70000; ++i) silent.mutable_release()->add_lease_ids(i);
  ASSERT_TRUE(stream->Write(silent));
  stream->WritesDone();
  std::map<uint64_t, v1::SessionResponse> replies;
  SessionReplies reader(stream.get());
  v1::SessionResponse reply;
  while (reader.Next(&reply)) replies[reply.seq()] = reply;
  grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_message();
  EXPECT_EQ(replies.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto it = replies.find(i + 1);
    ASSERT_NE(it, replies.end()) << "no reply to request " << i + 1;
    grpc::StatusCode code = it->second.has_error() ? static_cast<grpc::StatusCode>(it->second.error().code())
                                                   : grpc::StatusCode::OK;
    EXPECT_EQ(CodeName(code), CodeName(requests[i].second))
        << "request " << i + 1 << ": " << it->second.ShortDebugString().substr(0, 300);
  }
  ExpectIntact("hostile session stream ops", baseline);
}

TEST_F(HostileTest, SessionBatchesAnswerEveryRequestAndRefuseNestingAndExcess) {
  v1::StatusResponse baseline = GetStatus();
  {
    grpc::ClientContext context;
    Authorize(context, token());
    auto stream = stub_->Session(&context);
    v1::SessionRequest batch;
    v1::SessionRequest* missing = batch.mutable_batch()->add_requests();
    missing->set_seq(1);
    missing->mutable_acquire()->set_name("ns/not-there");
    v1::SessionRequest* nested = batch.mutable_batch()->add_requests();
    nested->set_seq(2);
    nested->mutable_batch()->add_requests()->mutable_release();
    v1::SessionRequest* release = batch.mutable_batch()->add_requests();
    release->set_seq(3);
    release->mutable_release()->add_lease_ids(kU64Max);
    batch.mutable_batch()->add_requests()->mutable_release();  // seq 0: no reply wanted
    ASSERT_TRUE(stream->Write(batch));
    stream->WritesDone();
    SessionReplies reader(stream.get());
    std::map<uint64_t, v1::SessionResponse> replies;
    v1::SessionResponse reply;
    while (reader.Next(&reply)) replies[reply.seq()] = reply;
    EXPECT_TRUE(stream->Finish().ok());
    ASSERT_EQ(replies.size(), 3u);
    EXPECT_EQ(replies[1].error().code(), grpc::StatusCode::NOT_FOUND) << replies[1].ShortDebugString();
    EXPECT_EQ(replies[2].error().code(), grpc::StatusCode::INVALID_ARGUMENT) << replies[2].ShortDebugString();
    EXPECT_NE(replies[2].error().message().find("batch inside a batch"), std::string::npos);
    EXPECT_TRUE(replies[3].has_release()) << replies[3].ShortDebugString();
    // Replies ready together leave together.
    EXPECT_EQ(reader.messages(), 1);
  }
  {
    grpc::ClientContext context;
    Authorize(context, token());
    auto stream = stub_->Session(&context);
    v1::SessionRequest batch;
    for (int i = 0; i < 4097; ++i) {
      v1::SessionRequest* inner = batch.mutable_batch()->add_requests();
      inner->set_seq(i + 1);
      inner->mutable_acquire()->set_name("ns/not-there");
    }
    ASSERT_TRUE(stream->Write(batch));
    SessionReplies reader(stream.get());
    v1::SessionResponse reply;
    while (reader.Next(&reply)) {
      // This session's second stream starts with a cache_reset push; no reply may come.
      EXPECT_TRUE(reply.has_cache_reset()) << "a reply to an oversized batch: "
                                           << reply.ShortDebugString().substr(0, 300);
    }
    grpc::Status finished = stream->Finish();
    EXPECT_EQ(CodeName(finished.error_code()), "INVALID_ARGUMENT");
    EXPECT_NE(finished.error_message().find("at most 4096"), std::string::npos) << finished.error_message();
  }
  ExpectIntact("session batches", baseline);
}

TEST_F(HostileTest, CancelWaitsEndsOnlyThisStreamsWaitsOfTheSeqsNamed) {
  v1::StatusResponse baseline = GetStatus();
  {
    grpc::ClientContext context;
    Authorize(context, token());
    auto stream = stub_->Session(&context);
    // Two waits under one seq (a client may reuse one), one under another, then a cancel of
    // seq 5 and of seqs that name nothing.
    for (auto [seq, name] : {std::pair<uint64_t, const char*>{5, "ns/a"}, {5, "ns/b"}, {6, "ns/c"}}) {
      v1::SessionRequest acquire;
      acquire.set_seq(seq);
      acquire.mutable_acquire()->set_name(name);
      acquire.mutable_acquire()->set_timeout_ms(1500);
      ASSERT_TRUE(stream->Write(acquire));
    }
    v1::SessionRequest cancel;
    cancel.set_seq(7);  // ignored: a cancel is never answered
    for (uint64_t seq : {uint64_t{5}, uint64_t{99}, kU64Max}) cancel.mutable_cancel_waits()->add_seqs(seq);
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(stream->Write(cancel));
    // Read before half-closing: the end of the client's writes cancels every wait left.
    SessionReplies reader(stream.get());
    std::vector<v1::SessionResponse> replies;
    v1::SessionResponse reply;
    std::chrono::steady_clock::duration cancelled_after{};
    while (replies.size() < 3 && reader.Next(&reply)) {
      if (reply.seq() != 0) replies.push_back(reply);  // not a push
      if (replies.size() == 2) cancelled_after = std::chrono::steady_clock::now() - start;
    }
    EXPECT_LT(cancelled_after, 1000ms);
    stream->WritesDone();
    while (reader.Next(&reply)) ADD_FAILURE() << "more: " << reply.ShortDebugString();
    EXPECT_TRUE(stream->Finish().ok());
    ASSERT_EQ(replies.size(), 3u);
    // Seq 5's two waits end at once, CANCELLED; seq 6's runs out its time.
    EXPECT_EQ(replies[0].seq(), 5u);
    EXPECT_EQ(replies[0].error().code(), grpc::StatusCode::CANCELLED) << replies[0].ShortDebugString();
    EXPECT_EQ(replies[1].seq(), 5u);
    EXPECT_EQ(replies[1].error().code(), grpc::StatusCode::CANCELLED) << replies[1].ShortDebugString();
    EXPECT_EQ(replies[2].seq(), 6u);
    EXPECT_EQ(replies[2].error().code(), grpc::StatusCode::DEADLINE_EXCEEDED) << replies[2].ShortDebugString();
    EXPECT_GE(std::chrono::steady_clock::now() - start, 1400ms);
  }
  {
    grpc::ClientContext context;
    Authorize(context, token());
    auto stream = stub_->Session(&context);
    v1::SessionRequest cancel;
    for (uint64_t seq = 1; seq <= 4097; ++seq) cancel.mutable_cancel_waits()->add_seqs(seq);
    ASSERT_TRUE(stream->Write(cancel));
    SessionReplies reader(stream.get());
    v1::SessionResponse reply;
    while (reader.Next(&reply)) EXPECT_TRUE(reply.has_cache_reset()) << reply.ShortDebugString().substr(0, 300);
    grpc::Status finished = stream->Finish();
    EXPECT_EQ(CodeName(finished.error_code()), "INVALID_ARGUMENT");
    EXPECT_NE(finished.error_message().find("at most 4096"), std::string::npos) << finished.error_message();
  }
  ExpectIntact("cancelled waits", baseline);
}

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

TEST_F(HostileTest, BadNamesAreInvalidArgumentNamingTheField) {
  v1::StatusResponse baseline = GetStatus();
  const std::vector<std::string> bad_names = {
      "ns/../x", "..", ".", "ns/./x", "ns//x", "/ns/x", "ns/x/", "", std::string("ns/a\0b", 6),
      "ns/x y", "ns/x\n", "ns/caf\xc3\xa9", "ns/\xe2\x80\xae", "ns/x*", "ns\\x",
      "ns/" + std::string(600, 'a'), "ns/" + std::string(300, 'a'), "ns/" + std::string(100000, 'a')};
  const std::vector<std::string> bad_prefixes = {"ns/../", "/", "//", "ns//", "../", std::string("n\0s", 3),
                                                 "ns/" + std::string(100000, 'a')};
  const std::vector<std::string> bad_namespaces = {"a/b", "..", ".", "/", std::string("n\0s", 3), "n s",
                                                   std::string(300, 'n'), std::string(100000, 'n')};
  std::vector<Case> cases;
  for (const std::string& name : bad_names) {
    std::string shown = name.substr(0, 20);
    v1::PublishRequest publish;
    publish.set_tensor_id(1);
    publish.set_name(name);
    if (!name.empty()) {  // an empty name means "unnamed" for publish
      cases.push_back({"publish " + shown, grpc::StatusCode::INVALID_ARGUMENT, "name",
                       [this, publish](grpc::ClientContext* c) {
                         v1::PublishResponse r;
                         return stub_->Publish(c, publish, &r);
                       }});
    }
    v1::AcquireRequest acquire;
    acquire.set_name(name);
    acquire.set_timeout_ms(5000);
    cases.push_back({"acquire " + shown, grpc::StatusCode::INVALID_ARGUMENT, "name",
                     [this, acquire](grpc::ClientContext* c) {
                       v1::AcquireResponse r;
                       return stub_->Acquire(c, acquire, &r);
                     }});
    v1::DeleteRequest remove;
    remove.set_name(name);
    cases.push_back({"delete " + shown, grpc::StatusCode::INVALID_ARGUMENT, "name",
                     [this, remove](grpc::ClientContext* c) {
                       v1::DeleteResponse r;
                       return stub_->Delete(c, remove, &r);
                     }});
    v1::StatRequest stat;
    stat.set_name(name);
    cases.push_back({"stat " + shown, grpc::StatusCode::INVALID_ARGUMENT, "name",
                     [this, stat](grpc::ClientContext* c) {
                       v1::StatResponse r;
                       return stub_->Stat(c, stat, &r);
                     }});
    if (!name.ends_with('/')) {
      v1::TakeRequest take;
      take.set_name_or_prefix(name);
      take.set_timeout_ms(5000);
      cases.push_back({"take " + shown, grpc::StatusCode::INVALID_ARGUMENT, "",
                       [this, take](grpc::ClientContext* c) {
                         v1::AcquireResponse r;
                         return stub_->Take(c, take, &r);
                       }});
    }
  }
  for (const std::string& prefix : bad_prefixes) {
    v1::ListRequest list;
    list.set_prefix(prefix);
    cases.push_back({"list " + prefix.substr(0, 20), grpc::StatusCode::INVALID_ARGUMENT, "prefix",
                     [this, list](grpc::ClientContext* c) {
                       v1::ListResponse r;
                       return stub_->List(c, list, &r);
                     }});
  }
  for (const std::string& ns : bad_namespaces) {
    v1::AllocateRequest allocate;
    allocate.set_ns(ns);
    *allocate.mutable_desc() = Float32({4});
    cases.push_back({"allocate in " + ns.substr(0, 20), grpc::StatusCode::INVALID_ARGUMENT, "namespace",
                     [this, allocate](grpc::ClientContext* c) {
                       v1::AllocateResponse r;
                       return stub_->Allocate(c, allocate, &r);
                     }});
  }
  RunCases(cases, token());
  for (const std::string& prefix : bad_prefixes) {
    v1::WatchRequest watch;
    watch.set_prefix(prefix);
    grpc::ClientContext context;
    Authorize(context, token());
    auto reader = stub_->Watch(&context, watch);
    v1::WatchEvent event;
    EXPECT_FALSE(reader->Read(&event));
    grpc::Status status = reader->Finish();
    EXPECT_EQ(CodeName(status.error_code()), "INVALID_ARGUMENT") << prefix.substr(0, 20);
    EXPECT_NE(status.error_message().find("prefix"), std::string::npos) << status.error_message();
  }
  // Bytes that are not UTF-8 do not decode as a proto3 string.
  std::string latin1 = std::string("\x0a\x07ns/caf\xe9", 9);  // AcquireRequest.name
  ExpectUndecodable(RawUnary(*generic_, "Acquire", latin1, &token()), "a Latin-1 name");
  ExpectIntact("bad names", baseline);
}

// ---------------------------------------------------------------------------------------
// The fd channel

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

// ---------------------------------------------------------------------------------------
// Clients that stop reading their streams

TEST_F(HostileTest, ASessionStreamThatNeverReadsStaysBounded) {
  if (kSanitized) {
    GTEST_SKIP() << "memory and timing bounds do not hold under a sanitizer; checked in the regular build";
  }
  RawSession producer = OpenSession(daemon_->socket());
  Publish(producer, "ns/x", 16);
  v1::StatusResponse baseline = GetStatus();
  int64_t rss_before = RssKiB(pid());

  RawSession greedy = OpenSession(daemon_->socket());
  grpc::ClientContext context;
  Authorize(context, greedy.token(), 120s);
  auto stream = stub_->Session(&context);
  std::atomic<int> written{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    v1::SessionRequest request;
    request.mutable_acquire()->set_name("ns/x");
    while (!stop && written < 3000000) {
      request.set_seq(written + 1);
      if (!stream->Write(request)) break;
      ++written;
    }
  });
  // Wait until the writes stall: the daemon stopped reading.
  int last = -1;
  for (auto deadline = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(500ms);
    if (written == last) break;
    last = written;
  }
  v1::StatusResponse during = GetStatus();
  int64_t rss_during = RssKiB(pid());
  RecordProperty("writes_before_stall", written.load());
  RecordProperty("leases_granted", static_cast<int>(during.leases() - baseline.leases()));
  RecordProperty("rss_growth_kib", static_cast<int>(rss_during - rss_before));
  EXPECT_LT(written.load(), 3000000) << "the daemon read everything without bound";
  EXPECT_LT(during.leases() - baseline.leases(), 200000u);
  EXPECT_LT(rss_during - rss_before, 256 * 1024) << "daemon RSS grew from " << rss_before << " KiB";
  // Others are still served at once.
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(Acquire(session_, "ns/x").ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);

  stop = true;
  context.TryCancel();
  writer.join();
  // Closing the session releases whatever it was granted.
  greedy.fd.reset();
  v1::StatusResponse now = GetStatus();
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       now.leases() != baseline.leases() + 1 && std::chrono::steady_clock::now() < deadline; now = GetStatus()) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(now.leases(), baseline.leases() + 1);  // our own acquire above
}

TEST_F(HostileTest, StoppedReadersGetOneResetInsteadOfABacklog) {
  if (kSanitized) {
    GTEST_SKIP() << "memory and timing bounds do not hold under a sanitizer; checked in the regular build";
  }
  // A session holding leases on many names, and a watcher of them; both stop reading while
  // every name is deleted.
  constexpr int kNames = 6000;
  RawSession producer = OpenSession(daemon_->socket());
  std::vector<std::string> names;
  for (int i = 0; i < kNames; ++i) {
    names.push_back("ns/" + std::string(200, 'n') + std::to_string(i));
    Publish(producer, names.back(), 0);
  }
  // The slow client keeps gRPC's flow-control window at its 64 KiB default (no
  // bandwidth-delay probing), so that what it does not read piles up in the daemon.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto slow_stub = v1::Broker::NewStub(
      grpc::CreateCustomChannel("unix:" + daemon_->socket(), grpc::InsecureChannelCredentials(), args));
  RawSession slow = OpenSession(daemon_->socket());
  grpc::ClientContext context;
  Authorize(context, slow.token(), 30s);
  auto stream = slow_stub->Session(&context);
  for (int i = 0; i < kNames; ++i) {
    v1::SessionRequest request;
    request.set_seq(i + 1);
    request.mutable_acquire()->set_name(names[i]);
    ASSERT_TRUE(stream->Write(request));
  }
  SessionReplies reader(stream.get());
  v1::SessionResponse reply;
  for (int i = 0; i < kNames; ++i) {
    ASSERT_TRUE(reader.Next(&reply));
    ASSERT_TRUE(reply.has_acquire()) << reply.ShortDebugString();
  }
  grpc::ClientContext watch_context;
  Authorize(watch_context, slow.token(), 30s);
  v1::WatchRequest watch;
  watch.set_prefix("ns/");
  auto watcher = slow_stub->Watch(&watch_context, watch);
  std::this_thread::sleep_for(100ms);
  int64_t rss_before = RssKiB(pid());

  for (const std::string& name : names) {
    v1::DeleteRequest remove;
    remove.set_name(name);
    grpc::ClientContext delete_context;
    Authorize(delete_context, producer.token());
    v1::DeleteResponse response;
    ASSERT_TRUE(stub_->Delete(&delete_context, remove, &response).ok());
  }
  int64_t rss_after = RssKiB(pid());
  RecordProperty("rss_growth_kib", static_cast<int>(rss_after - rss_before));
  EXPECT_LT(rss_after - rss_before, 128 * 1024);

  // Now read: fewer pushes than changes, and a reset that says some were dropped.
  int retired = 0;
  bool reset = false;
  while (!reset && reader.Next(&reply)) {
    if (reply.has_retired()) ++retired;
    if (reply.has_cache_reset()) reset = true;
  }
  EXPECT_TRUE(reset) << "no cache_reset after " << retired << " of " << kNames << " pushes";
  EXPECT_LT(retired, kNames);
  int events = 0;
  bool watch_reset = false;
  v1::WatchEvent event;
  while (!watch_reset && watcher->Read(&event)) {
    if (event.kind() == v1::WatchEvent::KIND_RESET) watch_reset = true;
    ++events;
  }
  EXPECT_TRUE(watch_reset) << "no RESET after " << events << " of " << kNames << " events";
  context.TryCancel();
  watch_context.TryCancel();
  ASSERT_TRUE(Alive(pid()));
}

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
