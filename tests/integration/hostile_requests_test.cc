// Hostile request bodies over raw gRPC (hostile_fixture.h): random bytes to every RPC,
// extreme integers, huge fields, unknown enums, extreme but valid timeouts and TTLs, and bad
// names, prefixes and namespaces. Each gets a clear status naming the field, and the daemon
// is left as it was.
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tensord/v1/broker.grpc.pb.h"
#include "tests/integration/hostile_fixture.h"
#include "tests/integration/raw_wire.h"

namespace tensord {
namespace {

namespace v1 = tensord::v1;
using namespace std::chrono_literals;
using namespace testing;  // tensord::testing: HostileTest, the daemon fixture, the raw wire helpers

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

}  // namespace
}  // namespace tensord
