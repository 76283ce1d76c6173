// The daemon's standard gRPC services, against the real binary: grpc.health.v1.Health
// (Check, Watch, NOT_SERVING on SIGTERM), server reflection (what grpcurl uses: list the
// services, fetch the descriptors of a symbol and of a file, errors on the stream for names
// it does not know) and UNIMPLEMENTED for a method nobody serves.
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon_fixture.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"

namespace tensord::testing {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
namespace reflection = grpc::reflection::v1alpha;
using namespace std::chrono_literals;

class GrpcServicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    channel_ = grpc::CreateChannel("unix:" + daemon_.socket(), grpc::InsecureChannelCredentials());
  }

  static void Deadline(grpc::ClientContext& context, std::chrono::milliseconds after = 10s) {
    context.set_deadline(std::chrono::system_clock::now() + after);
  }

  // A Watch of `service` and its first status.
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> Watch(grpc::ClientContext& context, const std::string& service,
                                                                 HealthCheckResponse* first) {
    HealthCheckRequest request;
    request.set_service(service);
    auto stream = Health::NewStub(channel_)->Watch(&context, request);
    EXPECT_TRUE(stream->Read(first)) << "no first status for " << service;
    return stream;
  }

  grpc::Status Check(const std::string& service, HealthCheckResponse* response) {
    grpc::ClientContext context;
    Deadline(context);
    HealthCheckRequest request;
    request.set_service(service);
    return Health::NewStub(channel_)->Check(&context, request, response);
  }

  // One reflection stream, one request at a time.
  std::vector<reflection::ServerReflectionResponse> Reflect(const std::vector<reflection::ServerReflectionRequest>& requests,
                                                            grpc::Status* status) {
    grpc::ClientContext context;
    Deadline(context);
    auto stream = reflection::ServerReflection::NewStub(channel_)->ServerReflectionInfo(&context);
    std::vector<reflection::ServerReflectionResponse> responses;
    for (const auto& request : requests) {
      if (!stream->Write(request)) break;
      reflection::ServerReflectionResponse response;
      if (!stream->Read(&response)) break;
      responses.push_back(std::move(response));
    }
    stream->WritesDone();
    *status = stream->Finish();
    return responses;
  }

  DaemonProcess daemon_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(GrpcServicesTest, HealthCheckAnswersServingForTheServerAndTheBrokerAndNotFoundOtherwise) {
  HealthCheckResponse response;
  grpc::Status status = Check("", &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  status = Check("tensord.v1.Broker", &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  status = Check("no.such.Service", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(status.error_message().find("no.such.Service"), std::string::npos) << status.error_message();
}

TEST_F(GrpcServicesTest, HealthWatchSendsServingThenNotServingWhenTheDaemonDrains) {
  grpc::ClientContext context;
  Deadline(context, 30s);
  HealthCheckResponse response;
  auto stream = Watch(context, "tensord.v1.Broker", &response);
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  // SIGTERM: the watcher hears NOT_SERVING at once, its stream ends OK, and the daemon
  // exits as soon as no call is left, although this client is still connected (the drain
  // allows 5 s for calls in flight, not for idle connections).
  auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(daemon_.pid(), SIGTERM), 0);
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(stream->Read(&response));
  grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  int exit_status = daemon_.Stop();  // already going: reaps it
  EXPECT_TRUE(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 0) << exit_status;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4500ms);  // under the drain's 5 s
}

TEST_F(GrpcServicesTest, HealthWatchOfAnUnknownServiceSaysServiceUnknown) {
  grpc::ClientContext context;
  Deadline(context);
  HealthCheckResponse response;
  auto stream = Watch(context, "no.such.Service", &response);
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  context.TryCancel();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(GrpcServicesTest, ReflectionListsTheServicesAndDescribesTheBroker) {
  reflection::ServerReflectionRequest list;
  list.set_list_services("");
  reflection::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("tensord.v1.Broker");
  reflection::ServerReflectionRequest method;
  method.set_file_containing_symbol("tensord.v1.Broker.Session");
  grpc::Status status;
  auto responses = Reflect({list, symbol, method}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), 3u);

  std::vector<std::string> services;
  for (const auto& service : responses[0].list_services_response().service()) services.push_back(service.name());
  EXPECT_EQ(services, (std::vector<std::string>{"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                                                "tensord.v1.Broker"}));
  EXPECT_EQ(responses[0].original_request().list_services(), "");

  // The descriptors build into a pool of their own (the file and everything it imports),
  // where the Broker's methods have the shapes a tool needs to call them.
  for (int i : {1, 2}) {
    ASSERT_TRUE(responses[i].has_file_descriptor_response()) << responses[i].DebugString();
    google::protobuf::DescriptorPool pool;
    std::vector<google::protobuf::FileDescriptorProto> files;
    for (const std::string& bytes : responses[i].file_descriptor_response().file_descriptor_proto()) {
      files.emplace_back();
      ASSERT_TRUE(files.back().ParseFromString(bytes));
    }
    // Dependencies come after the file that imports them: build them first.
    for (auto it = files.rbegin(); it != files.rend(); ++it) ASSERT_NE(pool.BuildFile(*it), nullptr) << it->name();
    const auto* broker = pool.FindServiceByName("tensord.v1.Broker");
    ASSERT_NE(broker, nullptr);
    const auto* session = broker->FindMethodByName("Session");
    ASSERT_NE(session, nullptr);
    EXPECT_TRUE(session->client_streaming() && session->server_streaming());
    const auto* watch = broker->FindMethodByName("Watch");
    ASSERT_NE(watch, nullptr);
    EXPECT_TRUE(!watch->client_streaming() && watch->server_streaming());
    EXPECT_NE(pool.FindMessageTypeByName("tensord.v1.AcquireRequest"), nullptr);
  }
}

TEST_F(GrpcServicesTest, ReflectionAnswersUnknownNamesWithAnErrorAndKeepsTheStreamOpen) {
  reflection::ServerReflectionRequest unknown_symbol;
  unknown_symbol.set_file_containing_symbol("no.such.Thing");
  reflection::ServerReflectionRequest unknown_file;
  unknown_file.set_file_by_filename("no/such.proto");
  reflection::ServerReflectionRequest file;
  file.set_file_by_filename("grpc/health/v1/health.proto");
  reflection::ServerReflectionRequest extensions;
  extensions.set_all_extension_numbers_of_type("tensord.v1.AcquireRequest");
  grpc::Status status;
  auto responses = Reflect({unknown_symbol, unknown_file, file, extensions}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), 4u);
  EXPECT_EQ(responses[0].error_response().error_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_NE(responses[0].error_response().error_message().find("no.such.Thing"), std::string::npos);
  EXPECT_EQ(responses[1].error_response().error_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  ASSERT_EQ(responses[2].file_descriptor_response().file_descriptor_proto_size(), 1);
  google::protobuf::FileDescriptorProto health;
  ASSERT_TRUE(health.ParseFromString(responses[2].file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(health.package(), "grpc.health.v1");
  EXPECT_EQ(responses[3].all_extension_numbers_response().base_type_name(), "tensord.v1.AcquireRequest");
  EXPECT_EQ(responses[3].all_extension_numbers_response().extension_number_size(), 0);
}

TEST_F(GrpcServicesTest, AMethodNobodyServesIsUnimplementedAndNamed) {
  grpc::GenericStub stub(channel_);
  grpc::ClientContext context;
  Deadline(context);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  stub.UnaryCall(&context, "/tensord.v1.Broker/NoSuchMethod", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(s);
                   done = true;
                   done_cv.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(done_cv.wait_for(lock, 10s, [&] { return done; }));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(status.error_message().find("/tensord.v1.Broker/NoSuchMethod"), std::string::npos) << status.error_message();
}

}  // namespace
}  // namespace tensord::testing
