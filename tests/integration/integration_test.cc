// End-to-end tests against the real `tensord` binary, with producers and consumers in
// separate processes (tensord_test_peer). Only the public client API is used here.
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <thread>

#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/sanitizers.h"
#include "tests/integration/test_client.h"

namespace tensord {
namespace {

using testing::ChildProcess;
using testing::Connect;
using testing::DaemonProcess;
using testing::PeerArgs;
using testing::kAddressSanitizer;
using namespace std::chrono_literals;

// Polls Stat until `pred` holds or 10 s pass.
template <typename Pred>
bool WaitForStat(Client& client, const std::string& name, Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto stat = client.Stat(name);
    if (stat.ok() && pred(*stat)) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

Result<TensorInfo> PublishFilled(Client& client, const std::string& name, int64_t count, float value) {
  TensorSpec spec;
  spec.shape = {count};
  auto tensor = client.Allocate(name.substr(0, name.find('/')), spec);
  if (!tensor.ok()) return tensor.status();
  float* data = static_cast<float*>(tensor->mutable_data());
  for (int64_t i = 0; i < count; ++i) data[i] = value;
  Result<TensorInfo> published = client.Publish(*tensor, name);
  // The producer's own lease goes with `tensor`; tests count leases right after this.
  tensor = Status(StatusCode::kCancelled, "dropped");
  if (Status flushed = client.Flush(); !flushed.ok()) return flushed;
  return published;
}

TEST(Integration, ProducerAndConsumerProcessesSharePages) {
  DaemonProcess daemon;
  ChildProcess producer(PeerArgs({"produce", daemon.socket(), "ns/weights", "1024", "2.5"}));
  ASSERT_NE(producer.WaitForLine("published"), "");
  EXPECT_EQ(WEXITSTATUS(producer.Wait()), 0);

  // The binding outlives its producer.
  auto client = Connect(daemon);
  auto tensor = client->Acquire("ns/weights");
  ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
  EXPECT_EQ(tensor->info().shape, std::vector<int64_t>{1024});
  const float* data = static_cast<const float*>(tensor->data());
  EXPECT_EQ(data[0], 2.5f);
  EXPECT_EQ(data[1023], 2.5f);

  // Versioned and legacy DLPack views point at the very same pages: no copy.
  DLManagedTensorVersioned* versioned = tensor->ToDLPackVersioned();
  DLManagedTensor* legacy = tensor->ToDLPack();
  ASSERT_NE(versioned, nullptr);
  ASSERT_NE(legacy, nullptr);
  EXPECT_EQ(versioned->version.major, 1u);
  EXPECT_EQ(static_cast<char*>(versioned->dl_tensor.data) + versioned->dl_tensor.byte_offset,
            static_cast<const char*>(tensor->data()));
  EXPECT_EQ(static_cast<char*>(legacy->dl_tensor.data) + legacy->dl_tensor.byte_offset,
            static_cast<const char*>(tensor->data()));
  EXPECT_EQ(legacy->dl_tensor.dtype.code, kDLFloat);
  EXPECT_EQ(legacy->dl_tensor.ndim, 1);
  EXPECT_EQ(legacy->dl_tensor.shape[0], 1024);

  // One remote lease however many local views.
  auto stat = client->Stat("ns/weights");
  ASSERT_TRUE(stat.ok());
  EXPECT_EQ(stat->info.lease_count, 1u);

  // Deleters drop local references; the lease goes with the last one.
  tensor->Release();
  EXPECT_TRUE(client->Flush().ok());
  EXPECT_EQ(client->Stat("ns/weights")->info.lease_count, 1u);
  versioned->deleter(versioned);
  EXPECT_TRUE(client->Flush().ok());
  EXPECT_EQ(client->Stat("ns/weights")->info.lease_count, 1u);
  legacy->deleter(legacy);
  EXPECT_TRUE(client->Flush().ok());
  EXPECT_TRUE(WaitForStat(*client, "ns/weights", [](const TensorStat& s) { return s.info.lease_count == 0; }));
}

TEST(Integration, SecondAcquireInOneProcessSharesTheMapping) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_TRUE(PublishFilled(*client, "ns/a", 4096, 1.0f).ok());
  auto first = client->Acquire("ns/a");
  auto second = client->Acquire("ns/a");
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->data(), second->data());
  EXPECT_EQ(first->lease_id(), second->lease_id());
}

TEST(Integration, PublishTagsJoinTheAllocationsAndReplaceAKeyGivenAgain) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  TensorSpec spec;
  spec.shape = {4};
  spec.tags = {{"source", "camera"}, {"stage", "raw"}};
  auto tensor = client->Allocate("ns", spec);
  ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
  PublishOptions options;
  options.tags = {{"stage", "normalized"}, {"epoch", "3"}};
  auto published = client->Publish(*tensor, "ns/tagged", options);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  const std::map<std::string, std::string> want = {{"source", "camera"}, {"stage", "normalized"}, {"epoch", "3"}};
  EXPECT_EQ(published->tags, want);
  auto stat = client->Stat("ns/tagged");
  ASSERT_TRUE(stat.ok());
  EXPECT_EQ(stat->info.tags, want);

  auto other = client->Allocate("ns", spec);
  ASSERT_TRUE(other.ok());
  PublishOptions bad;
  bad.tags = {{"", "no key"}};
  auto refused = client->Publish(*other, "ns/bad", bad);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Stat("ns/bad").status().code(), StatusCode::kNotFound);
}

TEST(Integration, ConsumerWritesStayPrivateAndReadonlyIsEnforced) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_TRUE(PublishFilled(*client, "ns/cow", 1024, 7.0f).ok());
  auto cow = client->Acquire("ns/cow");
  ASSERT_TRUE(cow.ok());
  ASSERT_NE(cow->mutable_data(), nullptr);
  static_cast<float*>(cow->mutable_data())[0] = -1.0f;  // copy-on-write: ours only

  auto other = Connect(daemon);
  auto theirs = other->Acquire("ns/cow");
  ASSERT_TRUE(theirs.ok());
  EXPECT_EQ(static_cast<const float*>(theirs->data())[0], 7.0f);

  AcquireOptions readonly;
  readonly.readonly = true;
  auto ro = other->Acquire("ns/cow", readonly);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  EXPECT_TRUE(ro->readonly());
  EXPECT_EQ(ro->mutable_data(), nullptr);
  DLManagedTensorVersioned* view = ro->ToDLPackVersioned();
  EXPECT_NE(view->flags & kDLFlagBitMaskReadOnly, 0u);
  view->deleter(view);
}

TEST(Integration, WaitingFollowsTheContract) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  auto missing = client->Acquire("ns/later");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  AcquireOptions brief;
  brief.wait = Wait::For(100ms);
  auto start = std::chrono::steady_clock::now();
  auto expired = client->Acquire("ns/later", brief);
  EXPECT_EQ(expired.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 90ms);

  // The publish comes only once the broker holds the acquire as waiting: a publish that
  // won the race would test an acquire of a bound name instead.
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  AcquireOptions patient;
  patient.wait = Wait::For(30s);
  auto arriving = std::async(std::launch::async, [&] { return client->Acquire("ns/later", patient); });
  EXPECT_TRUE(testing::WaitForWaiting(*producer, client->session_id(), 1));
  EXPECT_TRUE(PublishFilled(*producer, "ns/later", 16, 3.0f).ok());
  auto arrived = arriving.get();
  ASSERT_TRUE(arrived.ok()) << arrived.status().ToString();
  EXPECT_EQ(static_cast<const float*>(arrived->data())[15], 3.0f);
  // The granted wait is gone from the broker.
  EXPECT_TRUE(testing::WaitForWaiting(*producer, client->session_id(), 0));
}

TEST(Integration, RepublishRetiresTheOldTensorButHoldersKeepTheirData) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  auto first = PublishFilled(*client, "ns/w", 256, 1.0f);
  ASSERT_TRUE(first.ok());
  auto old_view = client->Acquire("ns/w");
  ASSERT_TRUE(old_view.ok());
  auto second = PublishFilled(*client, "ns/w", 256, 2.0f);
  ASSERT_TRUE(second.ok());
  EXPECT_GT(second->generation, first->generation);
  EXPECT_EQ(static_cast<const float*>(old_view->data())[0], 1.0f);
  auto new_view = client->Acquire("ns/w");
  ASSERT_TRUE(new_view.ok());
  EXPECT_EQ(static_cast<const float*>(new_view->data())[0], 2.0f);
  auto by_id = client->Stat(TensorId{first->tensor_id});
  ASSERT_TRUE(by_id.ok());
  EXPECT_EQ(by_id->info.state, TensorState::kRetired);
  old_view->Release();
  ASSERT_TRUE(client->Flush().ok());
  // With its last lease gone the retired tensor is dropped.
  auto gone = std::chrono::steady_clock::now() + 5s;
  while (client->Stat(TensorId{first->tensor_id}).ok() && std::chrono::steady_clock::now() < gone) {
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_EQ(client->Stat(TensorId{first->tensor_id}).status().code(), StatusCode::kNotFound);
}

TEST(Integration, TakeUnbindsAtomicallyAndPrefixTakesTheOldest) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(PublishFilled(*client, "q/batch" + std::to_string(i), 8, static_cast<float>(i)).ok());
  }
  for (int i = 0; i < 3; ++i) {
    auto taken = client->Take("q/");
    ASSERT_TRUE(taken.ok()) << taken.status().ToString();
    EXPECT_EQ(static_cast<const float*>(taken->data())[0], static_cast<float>(i));
  }
  EXPECT_EQ(client->Take("q/").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(client->List("q/")->empty());
}

TEST(Integration, WatchStreamsBindingChanges) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  auto watcher = client->Watch("w/");
  ASSERT_TRUE(watcher.ok());
  ASSERT_TRUE(PublishFilled(*client, "w/x", 4, 1.0f).ok());
  ASSERT_TRUE(client->Delete("w/x").ok());
  auto bound = (*watcher)->Next(5s);
  ASSERT_TRUE(bound.ok() && bound->has_value());
  EXPECT_EQ((*bound)->kind, WatchEvent::Kind::kBound);
  EXPECT_EQ((*bound)->name, "w/x");
  auto unbound = (*watcher)->Next(5s);
  ASSERT_TRUE(unbound.ok() && unbound->has_value());
  EXPECT_EQ((*unbound)->kind, WatchEvent::Kind::kUnbound);
}

TEST(Integration, KillMinusNineOfAHolderReleasesItsLeases) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_TRUE(PublishFilled(*client, "ns/held", 1024, 1.0f).ok());
  ChildProcess holder(PeerArgs({"hold", daemon.socket(), "ns/held"}));
  ASSERT_EQ(holder.WaitForLine("held"), "held 1024.000000");
  auto stat = client->Stat("ns/held");
  ASSERT_TRUE(stat.ok());
  ASSERT_EQ(stat->info.lease_count, 1u);
  ASSERT_EQ(stat->holders.size(), 1u);
  EXPECT_EQ(stat->holders[0].pid, static_cast<uint32_t>(holder.pid()));
  EXPECT_EQ(stat->holders[0].uid, getuid());
  holder.Kill(SIGKILL);
  EXPECT_TRUE(WaitForStat(*client, "ns/held", [](const TensorStat& s) { return s.info.lease_count == 0; }));
  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->leases, 0u);
}

TEST(Integration, KillMinusNineOfAProducerBeforePublishFreesItsTensor) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  uint64_t idle_bytes = client->GetStatus()->host_bytes_in_use;
  ChildProcess producer(PeerArgs({"allocate", daemon.socket(), "ns", "1048576"}));
  std::string line = producer.WaitForLine("allocated");
  ASSERT_NE(line, "");
  EXPECT_GE(client->GetStatus()->host_bytes_in_use, idle_bytes + 4 * 1048576);
  producer.Kill(SIGKILL);
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (client->GetStatus()->host_bytes_in_use != idle_bytes && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
  }
  auto status = client->GetStatus();
  EXPECT_EQ(status->host_bytes_in_use, idle_bytes);
  EXPECT_EQ(status->tensors, 0u);
  EXPECT_EQ(status->buffers, 0u);
}

TEST(Integration, ForkedChildNeverKeepsItsParentsSessionAlive) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_TRUE(PublishFilled(*client, "ns/shared", 64, 0.5f).ok());
  ChildProcess parent(PeerArgs({"fork-hold", daemon.socket(), "ns/shared"}));
  std::string parent_line = parent.WaitForLine("parent-held");
  ASSERT_NE(parent_line, "");
  std::string forked = parent.WaitForLine("forked");
  ASSERT_NE(forked, "");
  pid_t grandchild = static_cast<pid_t>(std::stol(forked.substr(7)));
  std::string child_line = parent.WaitForLine("child-held");
  ASSERT_NE(child_line, "") << "the forked child could not use the client";
  // The child has a session of its own, and still reads the inherited view.
  EXPECT_NE(child_line.substr(11, child_line.find(' ', 11) - 11), parent_line.substr(12));
  EXPECT_NE(child_line.find("inherited 32.000000"), std::string::npos) << child_line;
  EXPECT_TRUE(WaitForStat(*client, "ns/shared", [](const TensorStat& s) { return s.info.lease_count == 2; }));

  parent.Kill(SIGKILL);
  // The parent's lease goes although its child (holding inherited memory) lives on.
  EXPECT_TRUE(WaitForStat(*client, "ns/shared", [](const TensorStat& s) { return s.info.lease_count == 1; }));
  EXPECT_EQ(kill(grandchild, 0), 0) << "the child should still be running";
  kill(grandchild, SIGKILL);
  EXPECT_TRUE(WaitForStat(*client, "ns/shared", [](const TensorStat& s) { return s.info.lease_count == 0; }));
}

// Children forked back to back from a process whose client has a Watcher open and a
// thread blocked in Take(forever): every child reaches the broker with a session of its
// own, the parent's wait survives every fork (no item lost or taken twice), and its
// watcher keeps delivering (with a RESET after each fork gap).
TEST(Integration, BackToBackForksWithWaitsAndWatchersInFlight) {
  // GCC 12's AddressSanitizer does not hold its allocator's locks across fork(): a child
  // forked while another thread of the parent is inside malloc blocks forever in its own
  // first malloc (seen in CI: every thread of such a child waiting in
  // SizeClassAllocator64::GetFromAllocator). glibc's malloc, which the regular build uses,
  // takes its locks around fork().
  if (kAddressSanitizer) {
    GTEST_SKIP() << "45 forks beside busy threads can deadlock a child inside AddressSanitizer's "
                    "allocator (GCC 12's libasan); checked in the regular and TSan builds";
  }
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_TRUE(PublishFilled(*client, "ns/shared", 16, 1.0f).ok());
  constexpr int kRounds = 15;
  ChildProcess storm(PeerArgs({"fork-storm", daemon.socket(), "ns/shared", "ns/q/",
                               std::to_string(kRounds)}));
  int published = 0;
  for (int round = 0; round < kRounds; ++round) {
    ASSERT_TRUE(PublishFilled(*client, "ns/q/" + std::to_string(1000 + round), 4,
                              static_cast<float>(round)).ok());
    ++published;
    ASSERT_NE(storm.WaitForLine("round " + std::to_string(round)), "") << "round " << round;
  }
  // Its watcher is back after the last fork (it saw a probe the peer published).
  ASSERT_EQ(storm.WaitForLine("synced"), "synced");
  ASSERT_TRUE(PublishFilled(*client, "ns/q/end", 1, 0.0f).ok());
  std::string result = storm.WaitForLine("storm");
  ASSERT_NE(result, "");
  int failed = -1, taken = -1, events = -1, resets = -1, saw_end = -1;
  ASSERT_EQ(std::sscanf(result.c_str(), "storm %d %d %d %d %d", &failed, &taken, &events, &resets,
                        &saw_end), 5)
      << result;
  EXPECT_EQ(failed, 0) << "children or parent calls that failed";
  EXPECT_EQ(taken, published) << "items taken across the forks";
  EXPECT_GE(resets, 1) << "the watcher should report the gap of each fork: " << result;
  EXPECT_EQ(saw_end, 1) << "the watcher stopped delivering after the forks: " << result;
  EXPECT_TRUE(client->List("ns/q/")->empty());
}

TEST(Integration, QuotaAnswersResourceExhaustedWithUseAndLimit) {
  DaemonProcess daemon({"--max-host-bytes", "1MiB"});
  auto client = Connect(daemon);
  TensorSpec spec;
  spec.shape = {1 << 20};  // 4 MiB of float32
  auto tensor = client->Allocate("ns", spec);
  ASSERT_EQ(tensor.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(tensor.status().message().find("1048576"), std::string::npos) << tensor.status().message();
  EXPECT_EQ(client->GetStatus()->tensors, 0u);
}

TEST(Integration, HostileDescriptionsAreRefusedAndNothingIsRegistered) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  TensorSpec huge;
  huge.shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_EQ(client->Allocate("ns", huge).status().code(), StatusCode::kInvalidArgument);
  TensorSpec negative;
  negative.shape = {4, -1};
  EXPECT_EQ(client->Allocate("ns", negative).status().code(), StatusCode::kInvalidArgument);
  TensorSpec bad_dtype;
  bad_dtype.dtype = DLDataType{kDLFloat, 12, 1};
  bad_dtype.shape = {4};
  EXPECT_EQ(client->Allocate("ns", bad_dtype).status().code(), StatusCode::kInvalidArgument);
  TensorSpec spec;
  spec.shape = {4};
  auto tensor = client->Allocate("ns", spec);
  ASSERT_TRUE(tensor.ok());
  EXPECT_EQ(client->Publish(*tensor, "ns/../x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Publish(*tensor, "ns//x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->GetStatus()->named_tensors, 0u);
}

TEST(Integration, PublishNoWaitKeepsOrderAndItsFailuresComeWithTheNextFlush) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  auto reader = Connect(daemon);
  TensorSpec spec;
  spec.shape = {4};
  auto tensor = client->Allocate("nw", spec);
  ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
  static_cast<float*>(tensor->mutable_data())[0] = 7.0f;
  ASSERT_TRUE(client->PublishNoWait(*tensor, "nw/a").ok());
  // This client's next request comes after the publish on the stream.
  auto mine = client->Acquire("nw/a");
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  EXPECT_EQ(static_cast<const float*>(mine->data())[0], 7.0f);
  ASSERT_TRUE(client->Flush().ok());
  auto theirs = reader->Acquire("nw/a");
  ASSERT_TRUE(theirs.ok()) << theirs.status().ToString();
  EXPECT_EQ(static_cast<const float*>(theirs->data())[0], 7.0f);

  // Refusals by the broker: the name is taken (if_absent), the namespace is another.
  auto clash = client->Allocate("nw", spec);
  auto elsewhere = client->Allocate("nw", spec);
  ASSERT_TRUE(clash.ok() && elsewhere.ok());
  PublishOptions if_absent;
  if_absent.condition = PublishOptions::Condition::kIfAbsent;
  EXPECT_TRUE(client->PublishNoWait(*clash, "nw/a", if_absent).ok());
  EXPECT_TRUE(client->PublishNoWait(*elsewhere, "other/b").ok());
  Status flushed = client->Flush();
  EXPECT_EQ(flushed.code(), StatusCode::kAlreadyExists) << flushed.ToString();
  EXPECT_NE(flushed.message().find("2 publishes sent without waiting failed"), std::string::npos)
      << flushed.ToString();
  EXPECT_NE(flushed.message().find("'nw/a'"), std::string::npos) << flushed.ToString();
  EXPECT_NE(flushed.message().find("'other/b'"), std::string::npos) << flushed.ToString();
  EXPECT_TRUE(client->Flush().ok()) << "a failure is reported once";

  // Checks made here fail at the call.
  EXPECT_EQ(client->PublishNoWait(TensorRef(), "nw/c").code(), StatusCode::kInvalidArgument);

  // More unconfirmed publishes than the client lets pile up (allocated ahead, so no reply
  // confirms them on the way): the one over the bound waits, and every one of them lands.
  constexpr int kMany = 5000;
  std::vector<TensorRef> many;
  for (int chunk = 0; chunk < 2; ++chunk) {
    auto refs = client->AllocateMany("nw", std::vector<TensorSpec>(kMany / 2, spec));
    ASSERT_TRUE(refs.ok()) << refs.status().ToString();
    for (TensorRef& ref : *refs) many.push_back(std::move(ref));
  }
  for (int i = 0; i < kMany; ++i) {
    ASSERT_TRUE(client->PublishNoWait(many[i], "nw/many/" + std::to_string(i)).ok());
  }
  ASSERT_TRUE(client->Flush().ok());
  auto listed = reader->List("nw/many/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), static_cast<size_t>(kMany));
}

TEST(Integration, ZeroByteTensorsHaveNoBuffer) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  TensorSpec spec;
  spec.shape = {0, 3};
  auto tensor = client->Allocate("ns", spec);
  ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
  ASSERT_TRUE(client->Publish(*tensor, "ns/empty").ok());
  auto got = client->Acquire("ns/empty");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->info().nbytes, 0u);
  DLManagedTensor* view = got->ToDLPack();
  EXPECT_NE(view->dl_tensor.data, nullptr);
  view->deleter(view);
  EXPECT_EQ(client->GetStatus()->buffers, 0u);
}

TEST(Integration, SecondDaemonOnTheSameSocketRefusesToStart) {
  DaemonProcess daemon;
  ChildProcess second({TENSORD_BIN, "--socket", daemon.socket()});
  int status = second.Wait();
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  // The first one still serves.
  auto client = Connect(daemon);
  EXPECT_TRUE(client->GetStatus().ok());
}

TEST(Integration, SocketsAreGroupReadableOnlyAndSigtermExitsZero) {
  DaemonProcess daemon;
  struct stat info{};
  ASSERT_EQ(stat(daemon.socket().c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0660u);
  ASSERT_EQ(stat((daemon.socket() + ".fd").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0660u);
  auto client = Connect(daemon);
  auto tensor = client->Acquire("ns/x");  // a session is open while we stop
  int status = daemon.Stop();
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(Integration, SigtermEndsAWaitingAcquireAndExitsWithoutWaitingForIdleClients) {
  DaemonProcess daemon;
  auto waiter = Connect(daemon);
  auto idle = Connect(daemon);
  ASSERT_TRUE(idle->GetStatus().ok());  // connected, nothing in flight
  std::thread stopper([&] {
    // The stop comes once the acquire waits at the broker, so that it is the wait it ends.
    EXPECT_TRUE(testing::WaitForWaiting(*idle, waiter->session_id(), 1));
    auto start = std::chrono::steady_clock::now();
    int status = daemon.Stop();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    // The drain allows 5 s for calls in flight; the ended wait and an idle client are not.
    // (The bound leaves a sanitized daemon's exit time to spare, and still tells the two apart.)
    EXPECT_LT(std::chrono::steady_clock::now() - start, 4500ms);
  });
  AcquireOptions patient;
  patient.wait = Wait::For(30s);
  auto start = std::chrono::steady_clock::now();
  auto never = waiter->Acquire("ns/never", patient);
  stopper.join();
  EXPECT_FALSE(never.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(Integration, NoDaemonGivesUnavailableNamingTheSocket) {
  ClientOptions options;
  options.socket_path = "/nonexistent/tensord.sock";
  auto client = Client::Connect(options);
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(client.status().message().find("/nonexistent/tensord.sock"), std::string::npos);
}

}  // namespace
}  // namespace tensord
