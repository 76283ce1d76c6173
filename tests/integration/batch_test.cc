// Batches (AllocateMany, PublishMany, AcquireMany), batched FETCH_FD and arena mappings,
// against the real `tensord` binary. Links the static client (tensord_client_core) instead of
// libtensord.so, so that besides the public API it can look at a session's mapping cache
// (how many buffers it fetched, how many mappings it keeps) through internal::ClientPeer.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/client_peer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/test_client.h"

namespace tensord {
namespace {

using testing::Connect;
using testing::DaemonProcess;
using testing::Options;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

// A client whose session's internals the test can look at.
std::shared_ptr<internal::ClientPeer> Core(const ClientOptions& options) {
  auto core = internal::ClientPeer::Create(options);
  EXPECT_TRUE(core.ok()) << core.status().ToString();
  return core.ok() ? std::move(core).value() : nullptr;
}

internal::MappingCache& Mappings(internal::ClientPeer& core) {
  auto session = core.CurrentSession();
  EXPECT_TRUE(session.ok());
  return (*session)->mappings_for_test();
}

TensorSpec Floats(int64_t n, bool isolated = false) {
  TensorSpec spec;
  spec.shape = {n};
  spec.isolated = isolated;
  return spec;
}

void Fill(const TensorRef& ref, float value) {
  float* data = static_cast<float*>(ref.mutable_data());
  ASSERT_NE(data, nullptr);
  for (int64_t i = 0; i < ref.info().shape[0]; ++i) data[i] = value;
}

// Allocates one float tensor per name (in the names' namespace), fills tensor i with
// `first + i`, publishes them all and drops the producer's leases (flushed).
Status PublishBatch(Client& client, const std::vector<std::string>& names, int64_t count,
                    float first, bool isolated) {
  std::vector<AllocateItem> items;
  for (const std::string& name : names) {
    items.push_back(AllocateItem{name.substr(0, name.find('/')), Floats(count, isolated)});
  }
  auto refs = client.AllocateMany(items);
  if (!refs.ok()) return refs.status();
  std::vector<PublishItem> publish;
  for (size_t i = 0; i < names.size(); ++i) {
    float* data = static_cast<float*>((*refs)[i].mutable_data());
    for (int64_t k = 0; k < count; ++k) data[k] = first + static_cast<float>(i);
    publish.push_back(PublishItem{&(*refs)[i], names[i], {}});
  }
  auto infos = client.PublishMany(publish);
  if (!infos.ok()) return infos.status();
  refs = Status(StatusCode::kCancelled, "dropped");
  return client.Flush();
}

std::vector<std::string> Names(const std::string& stem, int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(stem + std::to_string(i));
  return names;
}

TEST(Batch, AllocatePublishAndAcquireRoundTripInOrder) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  std::vector<TensorSpec> specs(4);
  specs[0].shape = {16};
  specs[1].dtype = dtypes::kInt64;
  specs[1].shape = {2, 3};
  specs[2].dtype = dtypes::kUInt8;
  specs[2].shape = {0};  // no buffer at all
  specs[3].dtype = dtypes::kFloat64;
  specs[3].shape = {1000};
  specs[3].isolated = true;
  specs[3].tags = {{"kind", "big"}};
  auto refs = producer->AllocateMany("ns", specs);
  ASSERT_TRUE(refs.ok()) << refs.status().ToString();
  ASSERT_EQ(refs->size(), 4u);
  for (int i = 0; i < 16; ++i) static_cast<float*>((*refs)[0].mutable_data())[i] = 0.5f * i;
  for (int i = 0; i < 6; ++i) static_cast<int64_t*>((*refs)[1].mutable_data())[i] = -i;
  for (int i = 0; i < 1000; ++i) static_cast<double*>((*refs)[3].mutable_data())[i] = i * 2.0;
  EXPECT_EQ((*refs)[1].info().shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*refs)[3].info().tags.at("kind"), "big");

  const std::vector<std::string> names = Names("ns/r", 4);
  std::vector<PublishItem> items;
  for (size_t i = 0; i < names.size(); ++i) items.push_back(PublishItem{&(*refs)[i], names[i], {}});
  auto infos = producer->PublishMany(items);
  ASSERT_TRUE(infos.ok()) << infos.status().ToString();
  ASSERT_EQ(infos->size(), 4u);
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ((*infos)[i].name, names[i]);
    EXPECT_EQ((*infos)[i].tensor_id, (*refs)[i].info().tensor_id);
    EXPECT_EQ((*infos)[i].state, TensorState::kSealed);
  }

  auto consumer = Connect(daemon);
  auto got = consumer->AcquireMany(names);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), 4u);
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ((*got)[i].info().name, names[i]);
  EXPECT_EQ(static_cast<const float*>((*got)[0].data())[15], 7.5f);
  EXPECT_EQ(static_cast<const int64_t*>((*got)[1].data())[5], -5);
  EXPECT_EQ((*got)[2].info().nbytes, 0u);
  EXPECT_NE((*got)[2].data(), nullptr);
  EXPECT_EQ(static_cast<const double*>((*got)[3].data())[999], 1998.0);
  // Each element holds one lease, like a single Acquire.
  ASSERT_TRUE(consumer->Flush().ok());
  EXPECT_EQ(consumer->Stat(names[3])->info.lease_count, 2u);  // producer's and consumer's

  // Several namespaces in one batch, and an empty batch.
  auto mixed = producer->AllocateMany({AllocateItem{"ns1", Floats(4)}, AllocateItem{"ns2", Floats(4)}});
  ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
  EXPECT_TRUE(producer->AllocateMany("ns", {})->empty());
  EXPECT_TRUE(consumer->AcquireMany({})->empty());
  EXPECT_TRUE(producer->PublishMany({})->empty());

  AcquireOptions readonly;
  readonly.readonly = true;
  auto ro = consumer->AcquireMany({names[0], names[3]}, readonly);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  EXPECT_TRUE((*ro)[0].readonly() && (*ro)[1].readonly());
  EXPECT_EQ((*ro)[1].mutable_data(), nullptr);
}

TEST(Batch, AFailedAcquireNamesItsElementAndReleasesTheOthers) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_TRUE(PublishBatch(*client, {"ns/a", "ns/b"}, 64, 1.0f, false).ok());
  ASSERT_EQ(client->GetStatus()->leases, 0u);

  auto got = client->AcquireMany({"ns/a", "ns/absent", "ns/b"});
  ASSERT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().ToString();
  EXPECT_THAT(got.status().message(), HasSubstr("acquire element 1 of 3 'ns/absent'"));
  EXPECT_THAT(got.status().message(), HasSubstr("no tensor is bound to 'ns/absent'"));
  ASSERT_TRUE(client->Flush().ok());
  EXPECT_EQ(client->Stat("ns/a")->info.lease_count, 0u);
  EXPECT_EQ(client->Stat("ns/b")->info.lease_count, 0u);
  EXPECT_EQ(client->GetStatus()->leases, 0u);

  // Several failures: the first is named, the others counted.
  auto worse = client->AcquireMany({"ns/x", "ns/a", "ns/y"});
  ASSERT_EQ(worse.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(worse.status().message(), HasSubstr("acquire element 0 of 3 'ns/x'"));
  EXPECT_THAT(worse.status().message(), HasSubstr("1 other element failed too"));
  ASSERT_TRUE(client->Flush().ok());
  EXPECT_EQ(client->GetStatus()->leases, 0u);
}

TEST(Batch, AcquireManyElementsWaitAtTheSameTime) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  auto producer = Connect(daemon);
  ASSERT_NE(producer, nullptr);
  ASSERT_TRUE(PublishBatch(*client, {"ns/now"}, 4, 1.0f, false).ok());
  // Both missing names wait at the broker at once (one after the other would show one at
  // a time), and only then are they published.
  AcquireOptions patient;
  patient.wait = Wait::For(30s);
  auto getting = std::async(std::launch::async, [&] {
    return client->AcquireMany({"ns/later1", "ns/now", "ns/later0"}, patient);
  });
  EXPECT_TRUE(testing::WaitForWaiting(*producer, client->session_id(), 2));
  EXPECT_TRUE(PublishBatch(*producer, {"ns/later0", "ns/later1"}, 4, 5.0f, false).ok());
  auto got = getting.get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(static_cast<const float*>((*got)[0].data())[0], 6.0f);
  EXPECT_EQ(static_cast<const float*>((*got)[1].data())[0], 1.0f);
  EXPECT_EQ(static_cast<const float*>((*got)[2].data())[0], 5.0f);

  // Four names that never come: all four wait at once (so the batch ends after one wait,
  // not four), none gives up before its deadline, and the first is named.
  AcquireOptions brief;
  brief.wait = Wait::For(3s);  // room for the status polls to see the four waits, sanitized
  const auto start = std::chrono::steady_clock::now();
  auto expiring = std::async(std::launch::async, [&] {
    return client->AcquireMany({"ns/now", "ns/n0", "ns/n1", "ns/n2", "ns/n3"}, brief);
  });
  EXPECT_TRUE(testing::WaitForWaiting(*producer, client->session_id(), 4, 3s));
  auto expired = expiring.get();
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(expired.status().code(), StatusCode::kDeadlineExceeded) << expired.status().ToString();
  EXPECT_THAT(expired.status().message(), HasSubstr("acquire element 1 of 5 'ns/n0'"));
  EXPECT_THAT(expired.status().message(), HasSubstr("3 other elements failed too"));
  EXPECT_GE(took, 2950ms);
  EXPECT_TRUE(testing::WaitForWaiting(*producer, client->session_id(), 0));
  ASSERT_TRUE(client->Flush().ok());
  EXPECT_EQ(client->Stat("ns/now")->info.lease_count, 1u);  // only `got`'s
}

TEST(Batch, AnAllocationOverTheQuotaReleasesTheWholeBatch) {
  DaemonProcess daemon({"--max-host-bytes", "1MiB"});
  auto client = Connect(daemon);
  auto refs = client->AllocateMany("ns", {Floats(256, true), Floats(1 << 20, true), Floats(256, true)});
  ASSERT_EQ(refs.status().code(), StatusCode::kResourceExhausted) << refs.status().ToString();
  EXPECT_THAT(refs.status().message(), HasSubstr("allocate element 1 of 3 in 'ns'"));
  EXPECT_THAT(refs.status().message(), HasSubstr("1048576"));
  ASSERT_TRUE(client->Flush().ok());
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (client->GetStatus()->tensors != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_EQ(client->GetStatus()->tensors, 0u);
  EXPECT_EQ(client->GetStatus()->leases, 0u);
}

TEST(Batch, ABadSpecIsRefusedBeforeAnythingIsSent) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  TensorSpec bad;
  bad.shape = {4, -1};
  auto refs = client->AllocateMany("ns", {Floats(4), bad});
  ASSERT_EQ(refs.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refs.status().message(), HasSubstr("allocate element 1 of 2 in 'ns'"));
  EXPECT_EQ(client->GetStatus()->tensors, 0u);

  auto tensor = client->Allocate("ns", Floats(4));
  ASSERT_TRUE(tensor.ok());
  TensorRef empty;
  auto published = client->PublishMany({PublishItem{&*tensor, "ns/ok", {}}, PublishItem{&empty, "ns/x", {}}});
  ASSERT_EQ(published.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(published.status().message(), HasSubstr("publish element 1 of 2 as 'ns/x'"));
  EXPECT_EQ(client->Stat("ns/ok").status().code(), StatusCode::kNotFound);
}

TEST(Batch, AFailedPublishNamesItsElementAndSaysWhatWasPublished) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_TRUE(PublishBatch(*client, {"ns/taken"}, 4, 9.0f, false).ok());
  auto refs = client->AllocateMany("ns", {Floats(4), Floats(4), Floats(4)});
  ASSERT_TRUE(refs.ok()) << refs.status().ToString();
  PublishOptions if_absent;
  if_absent.condition = PublishOptions::Condition::kIfAbsent;
  auto infos = client->PublishMany({PublishItem{&(*refs)[0], "ns/p0", {}},
                                    PublishItem{&(*refs)[1], "ns/taken", if_absent},
                                    PublishItem{&(*refs)[2], "ns/p2", {}}});
  ASSERT_EQ(infos.status().code(), StatusCode::kAlreadyExists) << infos.status().ToString();
  EXPECT_THAT(infos.status().message(), HasSubstr("publish element 1 of 3"));
  EXPECT_THAT(infos.status().message(), HasSubstr("as 'ns/taken'"));
  EXPECT_THAT(infos.status().message(), HasSubstr("2 elements of the batch were published"));
  EXPECT_TRUE(client->Stat("ns/p0").ok());
  EXPECT_TRUE(client->Stat("ns/p2").ok());
  auto kept = client->Acquire("ns/taken");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(static_cast<const float*>(kept->data())[0], 9.0f);
}

TEST(Batch, BuffersNotMappedYetAreFetchedTogether) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  // Dedicated buffers: one fd each. 300 buffers take two FETCH_FD messages (253 + 47).
  const std::vector<std::string> names = Names("ns/f", 300);
  ASSERT_TRUE(PublishBatch(*producer, names, 8, 0.0f, true).ok());
  auto reader = Core(Options(daemon));
  ASSERT_NE(reader, nullptr);
  internal::MappingCache& mappings = Mappings(*reader);
  const std::vector<std::string> first(names.begin(), names.begin() + 20);
  auto got = reader->AcquireMany(first, {});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(mappings.fetch_calls(), 1u);
  EXPECT_EQ(mappings.fetches(), 20u);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(static_cast<const float*>((*got)[i].data())[7], static_cast<float>(i));
  }
  // Held ones are mapped already: only the other 280 are fetched, in one call.
  auto all = reader->AcquireMany(names, {});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(mappings.fetch_calls(), 2u);
  EXPECT_EQ(mappings.fetches(), 300u);
  for (size_t i : {size_t{0}, size_t{19}, size_t{20}, size_t{252}, size_t{253}, size_t{272},
                   size_t{273}, size_t{299}}) {
    EXPECT_EQ(static_cast<const float*>((*all)[i].data())[0], static_cast<float>(i)) << i;
    EXPECT_EQ((*all)[i].info().name, names[i]);
  }
  EXPECT_EQ((*all)[5].data(), (*got)[5].data());
}

// --- arenas (small tensors of one producer and namespace share a buffer) ---

// Allocates a small float tensor in `ns`, which the broker should carve from an arena.
Result<TensorRef> AllocateSmall(internal::ClientPeer& core, const std::string& ns, float value) {
  auto ref = core.Allocate(ns, Floats(64));
  if (!ref.ok()) return ref;
  float* data = static_cast<float*>(ref->mutable_data());
  for (int i = 0; i < 64; ++i) data[i] = value;
  return ref;
}

TEST(Batch, TakeManyTakesTheOldestUpToTheCountAndWaitsOnlyForTheFirst) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  auto consumer = Connect(daemon);
  const std::vector<std::string> names = Names("q/item", 5);
  auto refs = producer->AllocateMany("q", std::vector<TensorSpec>(5, Floats(4)));
  ASSERT_TRUE(refs.ok()) << refs.status().ToString();
  std::vector<PublishItem> items;
  for (size_t i = 0; i < names.size(); ++i) {
    static_cast<float*>((*refs)[i].mutable_data())[0] = static_cast<float>(i);
    items.push_back(PublishItem{&(*refs)[i], names[i], {}});
  }
  ASSERT_TRUE(producer->PublishMany(items).ok());

  auto first = consumer->TakeMany("q/", 3);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*first)[i].info().name, names[i]);  // oldest first
    EXPECT_EQ(static_cast<const float*>((*first)[i].data())[0], static_cast<float>(i));
  }
  // Fewer left than asked for: what is there, without waiting.
  auto rest = consumer->TakeMany("q/", 10, Wait::For(5s));
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  ASSERT_EQ(rest->size(), 2u);
  EXPECT_EQ((*rest)[1].info().name, names[4]);
  EXPECT_TRUE(consumer->List("q/")->empty());

  // Nothing there: fails at once without a wait, else waits for the first to arrive.
  auto none = consumer->TakeMany("q/", 4);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status().ToString();
  EXPECT_THAT(none.status().message(), HasSubstr("'q/'"));
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    auto t = producer->Allocate("q", Floats(4));
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(producer->Publish(*t, "q/late").ok());
  });
  auto waited = consumer->TakeMany("q/", 4, Wait::For(10s));
  later.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  ASSERT_EQ(waited->size(), 1u);
  EXPECT_EQ((*waited)[0].info().name, "q/late");
  auto expired = consumer->TakeMany("q/", 2, Wait::For(50ms));
  EXPECT_EQ(expired.status().code(), StatusCode::kDeadlineExceeded) << expired.status().ToString();
  EXPECT_EQ(consumer->TakeMany("q/", 0).status().code(), StatusCode::kInvalidArgument);

  // Each taken tensor holds exactly one lease, the consumer's.
  refs->clear();
  ASSERT_TRUE(producer->Flush().ok());
  ASSERT_TRUE(consumer->Flush().ok());
  auto status = consumer->GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->leases, 6u);
}

TEST(Arena, AProducerMapsItsArenaOnceAndKeepsItWritable) {
  DaemonProcess daemon;
  auto producer = Core(Options(daemon));
  ASSERT_NE(producer, nullptr);
  internal::MappingCache& mappings = Mappings(*producer);
  uint64_t arena = 0;
  for (int i = 0; i < 5; ++i) {
    auto ref = AllocateSmall(*producer, "ns", static_cast<float>(i));
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    ASSERT_TRUE(ref->info().arena) << "tensor " << i << ": the broker gave a 256-byte tensor "
                                   << "a dedicated buffer, not an arena";
    if (i == 0) arena = ref->info().buffer_id;
    EXPECT_EQ(ref->info().buffer_id, arena) << "tensor " << i;
    ASSERT_TRUE(producer->Publish(*ref, "ns/a" + std::to_string(i), {}).ok());
    // The producer's only view goes; its writable mapping of the arena must stay.
    ref = Status(StatusCode::kCancelled, "dropped");
    ASSERT_TRUE(producer->Flush().ok());
    EXPECT_EQ(mappings.KeptCountForTest(), 1u);
  }
  EXPECT_EQ(mappings.fetches(), 1u) << "the arena was fetched more than once";
  // A batch lands in the same arena and is written through the same mapping.
  auto refs = producer->AllocateMany({AllocateItem{"ns", Floats(64)}, AllocateItem{"ns", Floats(64)}});
  ASSERT_TRUE(refs.ok()) << refs.status().ToString();
  EXPECT_EQ((*refs)[0].info().buffer_id, arena);
  Fill((*refs)[0], 10.0f);
  Fill((*refs)[1], 11.0f);
  EXPECT_EQ(mappings.fetches(), 1u);

  auto reader = Connect(daemon);
  for (int i = 0; i < 5; ++i) {
    auto got = reader->Acquire("ns/a" + std::to_string(i));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(static_cast<const float*>(got->data())[63], static_cast<float>(i));
  }
}

TEST(Arena, AReaderMapsAnArenaOnceForAStreamOfFreshTensors) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  ClientOptions options = Options(daemon);
  options.lease_cache_linger = 30s;
  auto reader = Core(options);
  ASSERT_NE(reader, nullptr);
  internal::MappingCache& mappings = Mappings(*reader);
  uint64_t arena = 0;
  for (int i = 0; i < 6; ++i) {
    const std::string name = "ns/s" + std::to_string(i);
    ASSERT_TRUE(PublishBatch(*producer, {name}, 64, static_cast<float>(i), false).ok());
    auto got = reader->Acquire(name, {});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(got->info().arena) << name << " is not in an arena";
    if (i == 0) arena = got->info().buffer_id;
    EXPECT_EQ(got->info().buffer_id, arena);
    EXPECT_EQ(static_cast<const float*>(got->data())[0], static_cast<float>(i));
    // Its last view goes (and the lease with it); the arena mapping lingers.
    got = Status(StatusCode::kCancelled, "dropped");
    ASSERT_TRUE(reader->Flush().ok());
    EXPECT_EQ(mappings.KeptCountForTest(), 1u);
  }
  EXPECT_EQ(mappings.fetches(), 1u) << "a fresh tensor in a mapped arena fetched it again";
  EXPECT_EQ(reader->GetStatus()->leases, 0u);
}

TEST(Arena, AReaderLetsGoOfAnIdleArenaAfterTheLinger) {
  DaemonProcess daemon;
  auto producer = Connect(daemon);
  ASSERT_TRUE(PublishBatch(*producer, {"ns/l0"}, 64, 1.0f, false).ok());
  ClientOptions options = Options(daemon);
  options.lease_cache_linger = 200ms;
  auto reader = Core(options);
  ASSERT_NE(reader, nullptr);
  internal::MappingCache& mappings = Mappings(*reader);
  auto got = reader->Acquire("ns/l0", {});
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->info().arena);
  const void* data = got->data();
  got = Status(StatusCode::kCancelled, "dropped");
  ASSERT_TRUE(reader->Flush().ok());
  EXPECT_EQ(mappings.KeptCountForTest(), 1u);
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (mappings.KeptCountForTest() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(mappings.KeptCountForTest(), 0u) << "the idle arena was not unmapped after its linger";
  unsigned char vec[1];
  void* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(data) & ~uintptr_t{4095});
  EXPECT_NE(::mincore(page, 1, vec), 0) << "the arena is still mapped";
  auto again = reader->Acquire("ns/l0", {});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(mappings.fetches(), 2u);
}

// A reader's copy-on-write mapping of an arena outlives its views (while it holds another
// tensor in the arena, or for the linger). Its in-place writes to a tensor must not show in
// the next tensor the broker puts into the same slot.
TEST(Arena, AReadersInPlaceWritesNeverShowInTheSlotsNextTensor) {
  for (bool hold_a_neighbour : {true, false}) {
    SCOPED_TRACE(hold_a_neighbour ? "mapping held by a neighbour" : "mapping lingering");
    DaemonProcess daemon;
    auto producer = Connect(daemon);
    ClientOptions options = Options(daemon);
    options.lease_cache_linger = 30s;
    auto reader = Core(options);
    ASSERT_NE(reader, nullptr);
    // One after the other, so that both land in the arena the first one makes.
    ASSERT_TRUE(PublishBatch(*producer, {"ns/keep"}, 64, 1.0f, false).ok());
    ASSERT_TRUE(PublishBatch(*producer, {"ns/old"}, 64, 2.0f, false).ok());
    auto keep = reader->Acquire("ns/keep", {});
    ASSERT_TRUE(keep.ok());
    if (!hold_a_neighbour) keep = Status(StatusCode::kCancelled, "dropped");
    auto old = reader->Acquire("ns/old", {});
    ASSERT_TRUE(old.ok());
    ASSERT_TRUE(old->info().arena);
    if (keep.ok()) {
      ASSERT_EQ(old->info().buffer_id, keep->info().buffer_id);
    }
    const uint64_t arena = old->info().buffer_id;
    const uint64_t slot = old->info().buffer_offset;
    static_cast<float*>(old->mutable_data())[0] = -1.0f;  // private to this process
    old = Status(StatusCode::kCancelled, "dropped");
    ASSERT_TRUE(reader->Flush().ok());
    ASSERT_EQ(Mappings(*reader).KeptCountForTest(), 1u);

    // The old tensor goes (no binding, no lease): its slot is free for the next one.
    ASSERT_TRUE(producer->Delete("ns/old").ok());
    ASSERT_TRUE(PublishBatch(*producer, {"ns/new"}, 64, 5.0f, false).ok());
    auto fresh = reader->Acquire("ns/new", {});
    ASSERT_TRUE(fresh.ok());
    ASSERT_EQ(fresh->info().buffer_id, arena);
    ASSERT_EQ(fresh->info().buffer_offset, slot) << "the broker did not reuse the slot";
    EXPECT_EQ(static_cast<const float*>(fresh->data())[0], 5.0f)
        << "an in-place write to the slot's old tensor shows through";
    EXPECT_EQ(Mappings(*reader).fetches(), 1u);
  }
}

TEST(Arena, KeptMappingsGoWhenTheDaemonRestarts) {
  DaemonProcess daemon;
  ClientOptions options = Options(daemon);
  options.lease_cache_linger = 60s;
  auto core = Core(options);
  ASSERT_NE(core, nullptr);
  {
    auto producer = Connect(daemon);
    ASSERT_TRUE(PublishBatch(*producer, {"ns/r"}, 64, 3.0f, false).ok());
  }
  auto mine = AllocateSmall(*core, "ns", 4.0f);  // a producer arena of this session
  ASSERT_TRUE(mine.ok());
  auto got = core->Acquire("ns/r", {});
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->info().arena);
  got = Status(StatusCode::kCancelled, "dropped");
  mine = Status(StatusCode::kCancelled, "dropped");
  ASSERT_TRUE(core->Flush().ok());
  auto old = core->CurrentSession();
  ASSERT_TRUE(old.ok());
  EXPECT_EQ((*old)->mappings_for_test().KeptCountForTest(), 2u);

  daemon.Kill(SIGKILL);
  daemon.Start();
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!(*old)->dead() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE((*old)->dead());
  // The next call connects to the new daemon; the old session's mappings go.
  ASSERT_TRUE(core->GetStatus().ok());
  EXPECT_EQ((*old)->mappings_for_test().KeptCountForTest(), 0u);
  auto fresh = AllocateSmall(*core, "ns", 5.0f);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_TRUE(core->Publish(*fresh, "ns/after", {}).ok());
}

TEST(Arena, AForkedChildGetsAWritableArenaOfItsOwnSession) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  auto parent_tensor = client->Allocate("ns", Floats(64));
  ASSERT_TRUE(parent_tensor.ok());
  Fill(*parent_tensor, 1.0f);
  ASSERT_TRUE(client->Publish(*parent_tensor, "ns/parent").ok());
  const uint64_t parent_session = client->session_id();
  const uint64_t parent_buffer = parent_tensor->info().buffer_id;

  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: its own session, its own (writable) arena; exit codes say what failed.
    auto refs = client->AllocateMany("ns", {Floats(64), Floats(64)});
    if (!refs.ok()) _exit(10);
    if (client->session_id() == parent_session) _exit(11);
    if ((*refs)[0].info().arena && (*refs)[0].info().buffer_id == parent_buffer) _exit(12);
    for (int k = 0; k < 2; ++k) {
      float* data = static_cast<float*>((*refs)[k].mutable_data());
      if (data == nullptr) _exit(13);
      for (int i = 0; i < 64; ++i) data[i] = 7.0f + static_cast<float>(k);
    }
    auto infos = client->PublishMany({PublishItem{&(*refs)[0], "ns/child0", {}},
                                      PublishItem{&(*refs)[1], "ns/child1", {}}});
    if (!infos.ok()) _exit(14);
    // The parent's tensor is no producer tensor of the child's session.
    if (client->Publish(*parent_tensor, "ns/stolen").ok()) _exit(15);
    _exit(client->Flush().ok() ? 0 : 16);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child failed at step " << WEXITSTATUS(status);
  auto got = client->AcquireMany({"ns/child0", "ns/child1", "ns/parent"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(static_cast<const float*>((*got)[0].data())[63], 7.0f);
  EXPECT_EQ(static_cast<const float*>((*got)[1].data())[0], 8.0f);
  EXPECT_EQ(static_cast<const float*>((*got)[2].data())[0], 1.0f);
  // The parent still writes its own arena after the fork.
  auto more = client->Allocate("ns", Floats(64));
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  Fill(*more, 2.0f);
  ASSERT_TRUE(client->Publish(*more, "ns/parent2").ok());
}

}  // namespace
}  // namespace tensord
