// Hostile clients of the Session and Watch streams (hostile_fixture.h): ops with hostile
// values, batches that nest or exceed the limit, cancels of waits, and clients that stop
// reading their streams: each gets an error reply or a bounded answer, never a daemon that
// grows without bound.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tensord/v1/broker.grpc.pb.h"
#include "tests/integration/hostile_fixture.h"
#include "tests/integration/raw_wire.h"
#include "tests/integration/sanitizers.h"

namespace tensord {
namespace {

namespace v1 = tensord::v1;
using namespace std::chrono_literals;
using namespace testing;  // tensord::testing: HostileTest, the daemon fixture, the raw wire helpers

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

// Under a sanitizer the daemon is several times slower and ASan keeps freed memory in
// quarantine, so bounds on resident memory and on timing do not hold there; those checks
// run in the regular build.
using testing::kSanitized;

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

}  // namespace
}  // namespace tensord
