// SessionStream against an in-process fake Broker (a sync gRPC service on a unix socket in a
// temporary directory), whose Session handler each test scripts.
#include "client/session_stream.h"

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::internal {
namespace {

using common::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using tensord::v1::SessionRequest;
using tensord::v1::SessionResponse;
using ServerStream = grpc::ServerReaderWriter<SessionResponse, SessionRequest>;
using Clock = SessionStream::Clock;
using namespace std::chrono_literals;

class ScriptedBroker final : public tensord::v1::Broker::Service {
 public:
  using Script = std::function<grpc::Status(ServerStream*)>;
  explicit ScriptedBroker(Script script) : script_(std::move(script)) {}
  grpc::Status Session(grpc::ServerContext*, ServerStream* stream) override {
    return script_(stream);
  }

 private:
  Script script_;
};

// A publish request whose tensor id marks it, so replies can be told apart.
SessionRequest Marked(uint64_t mark) {
  SessionRequest request;
  request.mutable_publish()->set_tensor_id(mark);
  return request;
}

// The reply to `request`: its seq, and its mark echoed as the published tensor's id.
SessionResponse ReplyTo(const SessionRequest& request) {
  SessionResponse response;
  response.set_seq(request.seq());
  response.mutable_publish()->mutable_tensor()->set_tensor_id(request.publish().tensor_id());
  return response;
}

// Reads at least `n` requests, unpacking batches (false when the stream ends first); counts
// the stream messages they came in.
bool ReadN(ServerStream* stream, size_t n, std::vector<SessionRequest>* out,
           int* messages = nullptr) {
  size_t got = 0;
  while (got < n) {
    SessionRequest request;
    if (!stream->Read(&request)) return false;
    if (messages != nullptr) ++*messages;
    if (!request.has_batch()) {
      out->push_back(std::move(request));
      ++got;
      continue;
    }
    for (SessionRequest& inner : *request.mutable_batch()->mutable_requests()) {
      out->push_back(std::move(inner));
      ++got;
    }
  }
  return true;
}

// A fake broker serving `script`, and a SessionStream connected to it.
class Harness {
 public:
  explicit Harness(ScriptedBroker::Script script) : service_(std::move(script)) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "tensord-stream-test-XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
    EXPECT_FALSE(dir_.empty());
    const std::string address = "unix:" + dir_ + "/broker.sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    stub_ = tensord::v1::Broker::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    auto stream = SessionStream::Open(
        stub_.get(), "token",
        [this](const SessionResponse& push) {
          std::lock_guard<std::mutex> lock(mu_);
          pushes_.push_back(push);
        },
        [this](const SessionResponse& reply) {
          std::lock_guard<std::mutex> lock(mu_);
          orphans_.push_back(reply);
        },
        [this](absl::Status failure) {
          std::lock_guard<std::mutex> lock(mu_);
          quiet_failures_.push_back(std::move(failure));
        });
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (stream.ok()) stream_ = *std::move(stream);
  }
  ~Harness() {
    stream_.reset();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());  // cancels what is left
    std::filesystem::remove_all(dir_);
  }
  SessionStream& stream() { return *stream_; }
  const std::shared_ptr<SessionStream>& shared_stream() { return stream_; }
  std::vector<SessionResponse> pushes() {
    std::lock_guard<std::mutex> lock(mu_);
    return pushes_;
  }
  // Waits up to 10 s for `n` orphaned replies.
  std::vector<SessionResponse> WaitOrphans(size_t n) {
    auto deadline = Clock::now() + 10s;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (orphans_.size() >= n || Clock::now() > deadline) return orphans_;
      }
      std::this_thread::sleep_for(1ms);
    }
  }

  // Waits up to 10 s for `n` failures of quiet requests.
  std::vector<absl::Status> WaitQuietFailures(size_t n) {
    auto deadline = Clock::now() + 10s;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (quiet_failures_.size() >= n || Clock::now() > deadline) return quiet_failures_;
      }
      std::this_thread::sleep_for(1ms);
    }
  }

 private:
  ScriptedBroker service_;
  std::string dir_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<tensord::v1::Broker::Stub> stub_;
  std::shared_ptr<SessionStream> stream_;
  std::mutex mu_;
  std::vector<SessionResponse> pushes_;
  std::vector<SessionResponse> orphans_;
  std::vector<absl::Status> quiet_failures_;
};

// Requests the fake broker saw, read by the test thread: a lock makes the hand-over visible
// to TSan (the gRPC socket between them is not instrumented).
class Seen {
 public:
  void Add(const SessionRequest& request) {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(request);
  }
  std::vector<SessionRequest> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  std::mutex mu_;
  std::vector<SessionRequest> requests_;
};

std::vector<SessionRequest> MarkedBatch(uint64_t first, size_t n) {
  std::vector<SessionRequest> batch;
  for (size_t i = 0; i < n; ++i) batch.push_back(Marked(first + i));
  return batch;
}

TEST(SessionStreamTest, CallManySendsTheWholeBatchBeforeAnyReplyAndReturnsRepliesInOrder) {
  Seen seen_by_broker;
  Harness h([&](ServerStream* stream) {
    // Every request must arrive before the broker answers any: the buffered writes of the
    // batch were flushed by its last one.
    std::vector<SessionRequest> batch;
    int messages = 0;
    if (!ReadN(stream, 5, &batch, &messages)) {
      return grpc::Status(grpc::StatusCode::ABORTED, "short batch");
    }
    // One message for the whole batch.
    if (messages != 1) return grpc::Status(grpc::StatusCode::ABORTED, "batch in several messages");
    for (const SessionRequest& request : batch) seen_by_broker.Add(request);
    SessionResponse push;
    push.mutable_retired()->set_tensor_id(99);
    stream->Write(push);
    for (auto it = batch.rbegin(); it != batch.rend(); ++it) stream->Write(ReplyTo(*it));
    SessionRequest ignored;
    while (stream->Read(&ignored)) {
    }
    return grpc::Status::OK;
  });
  auto results = h.stream().CallMany(MarkedBatch(10, 5), Clock::now() + 10s);
  ASSERT_EQ(results.size(), 5u);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->publish().tensor().tensor_id(), 10 + i) << "reply " << i;
  }
  // Fresh, distinct, non-zero seqs, in the order of the batch.
  const std::vector<SessionRequest> seen = seen_by_broker.Get();
  ASSERT_EQ(seen.size(), 5u);
  std::set<uint64_t> seqs;
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].publish().tensor_id(), 10 + i);
    EXPECT_NE(seen[i].seq(), 0u);
    if (i > 0) {
      EXPECT_GT(seen[i].seq(), seen[i - 1].seq());
    }
    seqs.insert(seen[i].seq());
  }
  EXPECT_EQ(seqs.size(), 5u);
  ASSERT_EQ(h.pushes().size(), 1u);
  EXPECT_EQ(h.pushes()[0].retired().tensor_id(), 99u);
}

TEST(SessionStreamTest, ABatchMessageReachesCallersOrphanAndPushHandlers) {
  Harness h([&](ServerStream* stream) {
    std::vector<SessionRequest> seen;
    if (!ReadN(stream, 3, &seen)) return grpc::Status(grpc::StatusCode::ABORTED, "short batch");
    SessionResponse batch;
    auto* replies = batch.mutable_batch()->mutable_responses();
    *replies->Add() = ReplyTo(seen[2]);
    SessionResponse stray;
    stray.set_seq(seen[2].seq() + 1000);  // nobody waits for this one
    stray.mutable_publish()->mutable_tensor()->set_tensor_id(77);
    *replies->Add() = stray;
    replies->Add()->mutable_retired()->set_tensor_id(88);  // a push rides along
    *replies->Add() = ReplyTo(seen[0]);
    *replies->Add() = ReplyTo(seen[1]);
    stream->Write(batch);
    SessionRequest ignored;
    while (stream->Read(&ignored)) {
    }
    return grpc::Status::OK;
  });
  auto results = h.stream().CallMany(MarkedBatch(50, 3), Clock::now() + 10s);
  ASSERT_EQ(results.size(), 3u);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->publish().tensor().tensor_id(), 50 + i) << "reply " << i;
  }
  std::vector<SessionResponse> orphans = h.WaitOrphans(1);
  ASSERT_EQ(orphans.size(), 1u);
  EXPECT_EQ(orphans[0].publish().tensor().tensor_id(), 77u);
  // The push reached the push handler, and only it: the batch itself is not a push.
  ASSERT_EQ(h.pushes().size(), 1u);
  EXPECT_EQ(h.pushes()[0].retired().tensor_id(), 88u);
}

TEST(SessionStreamTest, CallAndCallManyShareTheSeqSpace) {
  Seen seen_by_broker;
  Harness h([&](ServerStream* stream) {
    std::vector<SessionRequest> requests;
    while (ReadN(stream, 1, &requests)) {
      for (const SessionRequest& request : requests) {
        seen_by_broker.Add(request);
        stream->Write(ReplyTo(request));
      }
      requests.clear();
    }
    return grpc::Status::OK;
  });
  auto one = h.stream().Call(Marked(1), Clock::now() + 10s);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->publish().tensor().tensor_id(), 1u);
  auto many = h.stream().CallMany(MarkedBatch(2, 3), Clock::now() + 10s);
  ASSERT_EQ(many.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(many[i].ok());
    EXPECT_EQ(many[i]->publish().tensor().tensor_id(), 2 + i);
  }
  const std::vector<SessionRequest> seen = seen_by_broker.Get();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_LT(seen[0].seq(), seen[1].seq());
  EXPECT_TRUE(h.stream().CallMany({}, Clock::now() + 1s).empty());
}

TEST(SessionStreamTest, ABrokenStreamFailsEveryOutstandingRequestWithUnavailable) {
  Harness h([](ServerStream* stream) {
    std::vector<SessionRequest> seen;
    if (!ReadN(stream, 4, &seen)) return grpc::Status(grpc::StatusCode::ABORTED, "short batch");
    stream->Write(ReplyTo(seen[1]));
    return grpc::Status(grpc::StatusCode::INTERNAL, "the fake broker hangs up");
  });
  auto results = h.stream().CallMany(MarkedBatch(20, 4), Clock::now() + 10s);
  ASSERT_EQ(results.size(), 4u);
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(results[1]->publish().tensor().tensor_id(), 21u);
  for (size_t i : {0u, 2u, 3u}) {
    EXPECT_THAT(results[i], StatusIs(absl::StatusCode::kUnavailable,
                                     HasSubstr("the session stream ended")))
        << "request " << i;
  }
  EXPECT_TRUE(h.stream().broken());
  // Once broken, a batch fails at once, every element of it.
  auto later = h.stream().CallMany(MarkedBatch(30, 2), Clock::now() + 10s);
  ASSERT_EQ(later.size(), 2u);
  for (const auto& result : later) {
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("fake broker hangs up")));
  }
}

TEST(SessionStreamTest, OnlyTheUnansweredTimeOutAndTheirLateRepliesAreOrphans) {
  absl::Notification late;
  Harness h([&](ServerStream* stream) {
    std::vector<SessionRequest> seen;
    if (!ReadN(stream, 3, &seen)) return grpc::Status(grpc::StatusCode::ABORTED, "short batch");
    stream->Write(ReplyTo(seen[0]));
    stream->Write(ReplyTo(seen[2]));
    late.WaitForNotification();
    stream->Write(ReplyTo(seen[1]));
    SessionRequest ignored;
    while (stream->Read(&ignored)) {
    }
    return grpc::Status::OK;
  });
  const auto start = Clock::now();
  auto results = h.stream().CallMany(MarkedBatch(40, 3), Clock::now() + 300ms);
  EXPECT_GE(Clock::now() - start, 250ms);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok());
  EXPECT_THAT(results[1], StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  EXPECT_TRUE(results[2].ok());
  EXPECT_FALSE(h.stream().broken());
  late.Notify();
  std::vector<SessionResponse> orphans = h.WaitOrphans(1);
  ASSERT_EQ(orphans.size(), 1u);
  EXPECT_EQ(orphans[0].publish().tensor().tensor_id(), 41u);
}

TEST(SessionStreamTest, AStartedCallIsCollectedLaterAndOneGivenUpGoesToTheOrphanHandler) {
  absl::Notification late;
  Harness h([&](ServerStream* stream) {
    std::vector<SessionRequest> seen;
    if (!ReadN(stream, 3, &seen)) return grpc::Status(grpc::StatusCode::ABORTED, "short");
    // The second call's reply first: by the time the first one is collected, the second
    // one's reply has been handed over (the poller reads in order).
    stream->Write(ReplyTo(seen[1]));
    stream->Write(ReplyTo(seen[0]));
    late.WaitForNotification();
    stream->Write(ReplyTo(seen[2]));
    SessionRequest ignored;
    while (stream->Read(&ignored)) {
    }
    return grpc::Status::OK;
  });
  auto first = SessionStream::Start(h.shared_stream(), Marked(60));
  auto second = SessionStream::Start(h.shared_stream(), Marked(61));
  auto third = SessionStream::Start(h.shared_stream(), Marked(62));
  ASSERT_TRUE(first.ok() && second.ok() && third.ok());
  absl::StatusOr<SessionResponse> reply = (*first)->Await(Clock::now() + 10s);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->publish().tensor().tensor_id(), 60u);
  // Given up after its reply came, and before its reply comes: both reach the handler.
  second->reset();
  third->reset();
  late.Notify();
  std::vector<SessionResponse> orphans = h.WaitOrphans(2);
  ASSERT_EQ(orphans.size(), 2u);
  EXPECT_EQ(orphans[0].publish().tensor().tensor_id(), 61u);
  EXPECT_EQ(orphans[1].publish().tensor().tensor_id(), 62u);
  EXPECT_FALSE(h.stream().broken());
}

// Voluntary context switches (sleeps that ended) of each thread of this process, by id.
std::map<std::string, long> WakeUpsByThread() {
  std::map<std::string, long> wake_ups;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream status(task.path() / "status");
    const std::string key = "voluntary_ctxt_switches:";
    for (std::string line; std::getline(status, line);) {
      if (line.rfind(key, 0) == 0) {
        wake_ups[task.path().filename()] = std::stol(line.substr(key.size()));
      }
    }
  }
  return wake_ups;
}

TEST(SessionStreamTest, ACallerBlockedInALongWaitCostsNoPeriodicWakeUps) {
  absl::Notification answer;
  Harness h([&](ServerStream* stream) {
    std::vector<SessionRequest> seen;
    if (!ReadN(stream, 1, &seen)) return grpc::Status(grpc::StatusCode::ABORTED, "short");
    answer.WaitForNotification();
    stream->Write(ReplyTo(seen[0]));
    SessionRequest ignored;
    while (stream->Read(&ignored)) {
    }
    return grpc::Status::OK;
  });
  absl::StatusOr<SessionResponse> reply;
  std::thread caller([&] { reply = h.stream().Call(Marked(70), Clock::now() + 30s); });
  std::this_thread::sleep_for(200ms);  // the call went out; its caller polls for the reply
  const std::map<std::string, long> before = WakeUpsByThread();
  std::this_thread::sleep_for(500ms);
  const std::map<std::string, long> after = WakeUpsByThread();
  answer.Notify();
  caller.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->publish().tensor().tensor_id(), 70u);
  // A thread woken on a 1 ms tick would show hundreds in the 500 ms; only this test's own
  // sleep and gRPC's occasional timers may show here.
  for (const auto& [thread, count] : after) {
    auto was = before.find(thread);
    if (was != before.end()) {
      EXPECT_LT(count - was->second, 50) << "thread " << thread;
    }
  }
}

TEST(SessionStreamTest, QuietRequestsAreAnsweredOnlyWhenTheyFailAndALaterReplyConfirmsThem) {
  Seen seen_by_broker;
  Harness h([&](ServerStream* stream) {
    std::vector<SessionRequest> seen;
    if (!ReadN(stream, 3, &seen)) return grpc::Status(grpc::StatusCode::ABORTED, "short");
    for (const SessionRequest& request : seen) seen_by_broker.Add(request);
    // The second quiet one fails; the first is answered by its silence.
    SessionResponse failed;
    failed.set_seq(seen[1].seq());
    failed.mutable_error()->set_code(static_cast<int>(grpc::StatusCode::ALREADY_EXISTS));
    failed.mutable_error()->set_message("the name is bound");
    stream->Write(failed);
    stream->Write(ReplyTo(seen[2]));
    SessionRequest ignored;
    while (stream->Read(&ignored)) {
    }
    return grpc::Status::OK;
  });
  ASSERT_TRUE(h.stream().SendQuiet(Marked(1), "publish 'a'").ok());
  ASSERT_TRUE(h.stream().SendQuiet(Marked(2), "publish 'b'").ok());
  EXPECT_EQ(h.stream().quiet_in_flight(), 2u);
  auto reply = h.stream().Call(Marked(3), Clock::now() + 10s);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->publish().tensor().tensor_id(), 3u);
  // The reply to the later call settled both: one failed, one went through.
  EXPECT_EQ(h.stream().quiet_in_flight(), 0u);
  std::vector<absl::Status> failures = h.WaitQuietFailures(1);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], StatusIs(absl::StatusCode::kAlreadyExists,
                                    AllOf(HasSubstr("publish 'b'"), HasSubstr("the name is bound"))));
  // Seqs follow the order of the writes, quiet ones included.
  const std::vector<SessionRequest> seen = seen_by_broker.Get();
  ASSERT_EQ(seen.size(), 3u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].publish().tensor_id(), i + 1);
    if (i > 0) {
      EXPECT_GT(seen[i].seq(), seen[i - 1].seq());
    }
  }
  EXPECT_TRUE(h.pushes().empty());
  EXPECT_TRUE(h.WaitOrphans(0).empty());
}

TEST(SessionStreamTest, QuietRequestsUnconfirmedWhenTheStreamBreaksAreReportedAsLost) {
  Harness h([](ServerStream* stream) {
    std::vector<SessionRequest> seen;
    if (!ReadN(stream, 2, &seen)) return grpc::Status(grpc::StatusCode::ABORTED, "short");
    return grpc::Status(grpc::StatusCode::INTERNAL, "the fake broker hangs up");
  });
  ASSERT_TRUE(h.stream().SendQuiet(Marked(1), "publish 'a'").ok());
  ASSERT_TRUE(h.stream().SendQuiet(Marked(2), "publish 'b'").ok());
  std::vector<absl::Status> failures = h.WaitQuietFailures(2);
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_THAT(failures[0], StatusIs(absl::StatusCode::kUnavailable,
                                    AllOf(HasSubstr("publish 'a'"), HasSubstr("fake broker hangs up"),
                                          HasSubstr("may not have happened"))));
  EXPECT_THAT(failures[1], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("publish 'b'")));
  EXPECT_TRUE(h.stream().broken());
  EXPECT_EQ(h.stream().quiet_in_flight(), 0u);
  // Once broken, nothing more is written: the caller hears it at once.
  EXPECT_THAT(h.stream().SendQuiet(Marked(3), "publish 'c'"),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

}  // namespace
}  // namespace tensord::internal
