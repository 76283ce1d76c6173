// Answers that grow with the number of names, past what one gRPC message may carry (4 MiB by
// default), against the real `tensord` binary through the public client: List (whole and by
// pages, with names bound and unbound between the pages), a Watch's initial bindings, and a
// TakeMany of tensors with long names and tags. Names are long (about 200 bytes) so that
// 25,000 of them take over 5 MiB and the test stays quick.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/test_client.h"

namespace tensord {
namespace {

using testing::Connect;
using testing::DaemonProcess;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr size_t kManyNames = 25000;
constexpr size_t kOneMessage = size_t{4} << 20;  // what gRPC lets a client receive by default

// "<ns>/<190 letters>-000123": about 200 bytes, sorting in index order.
std::string LongName(const std::string& ns, size_t index, char fill = 'n') {
  char digits[16];
  std::snprintf(digits, sizeof(digits), "-%06zu", index);
  return ns + "/" + std::string(190, fill) + digits;
}

std::vector<std::string> LongNames(const std::string& ns, size_t count) {
  std::vector<std::string> names;
  names.reserve(count);
  for (size_t i = 0; i < count; ++i) names.push_back(LongName(ns, i));
  return names;
}

size_t TotalBytes(const std::vector<std::string>& names) {
  size_t bytes = 0;
  for (const std::string& name : names) bytes += name.size();
  return bytes;
}

// Publishes a zero-byte tensor (no buffer: quick) under each name, in name order, 4096 to a
// batch, with `tags`; the producer's leases are dropped and flushed.
Status PublishEmpty(Client& client, const std::vector<std::string>& names,
                    const std::map<std::string, std::string>& tags = {}) {
  TensorSpec spec;
  spec.dtype = dtypes::kUInt8;
  spec.shape = {0};
  spec.tags = tags;
  for (size_t first = 0; first < names.size(); first += 4096) {
    const size_t count = std::min<size_t>(4096, names.size() - first);
    std::vector<AllocateItem> items;
    for (size_t i = 0; i < count; ++i) {
      items.push_back(AllocateItem{names[first + i].substr(0, names[first + i].find('/')), spec});
    }
    auto refs = client.AllocateMany(items);
    if (!refs.ok()) return refs.status();
    std::vector<PublishItem> publish;
    for (size_t i = 0; i < count; ++i) publish.push_back(PublishItem{&(*refs)[i], names[first + i], {}});
    auto infos = client.PublishMany(publish);
    if (!infos.ok()) return infos.status();
  }
  return client.Flush();
}

std::vector<std::string> NamesOf(const std::vector<TensorInfo>& infos) {
  std::vector<std::string> names;
  names.reserve(infos.size());
  for (const TensorInfo& info : infos) names.push_back(info.name);
  return names;
}

Status PublishOne(Client& client, const std::string& name) { return PublishEmpty(client, {name}); }

TEST(LargeAnswers, ListReturnsEveryNameOnceAndInOrderPastOneMessage) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> names = LongNames("big", kManyNames);
  ASSERT_GT(TotalBytes(names), kOneMessage);
  ASSERT_TRUE(PublishEmpty(*client, names).ok());

  auto listed = client->List("big/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(NamesOf(*listed), names);  // each once, in name order
  for (const TensorInfo& info : *listed) {
    ASSERT_EQ(info.state, TensorState::kSealed) << info.name;
    ASSERT_EQ(info.generation > 0, true) << info.name;
  }
  auto everything = client->List();
  ASSERT_TRUE(everything.ok()) << everything.status().ToString();
  EXPECT_EQ(NamesOf(*everything), names);
  auto none = client->List("big/nothing-here/");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->empty());
}

TEST(LargeAnswers, ListPagesAreBoundedAndGoOnAfterTheLastName) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  // With a tag, 4096 of these entries would be more than 1 MiB.
  const std::vector<std::string> names = LongNames("big", 12000);
  ASSERT_TRUE(PublishEmpty(*client, names, {{"pad", std::string(100, 'p')}}).ok());

  // A page as long as one answer holds: bounded by bytes, never empty, and its token is
  // its last name.
  auto first = client->ListPage("big/");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_FALSE(first->tensors.empty());
  EXPECT_LT(first->tensors.size(), size_t{4096});
  EXPECT_LE(TotalBytes(NamesOf(first->tensors)), size_t{1} << 20);
  EXPECT_EQ(first->next_page_token, first->tensors.back().name);
  EXPECT_EQ(NamesOf(first->tensors),
            std::vector<std::string>(names.begin(), names.begin() + static_cast<long>(first->tensors.size())));

  // Pages of 1000, with names bound and unbound between them: a name before the cursor is
  // not listed, one after it is; one unbound before its page is not; none twice.
  const std::string before = LongName("big", 0, 'a');  // sorts before every listed name
  const std::string after = LongName("big", 0, 'z');   // after every one
  const std::string unbound = names[11000];
  std::vector<std::string> seen;
  ListPageOptions options;
  options.limit = 1000;
  int pages = 0;
  do {
    auto page = client->ListPage("big/", options);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    ASSERT_LE(page->tensors.size(), size_t{1000});
    for (const TensorInfo& info : page->tensors) seen.push_back(info.name);
    if (++pages == 2) {
      ASSERT_TRUE(PublishOne(*client, before).ok());
      ASSERT_TRUE(PublishOne(*client, after).ok());
      ASSERT_TRUE(client->Delete(unbound).ok());
    }
    options.page_token = page->next_page_token;
  } while (!options.page_token.empty());
  EXPECT_EQ(pages, 12);  // 12,000 names, one gone, one new
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "a name listed twice";
  std::vector<std::string> expected = names;
  expected.erase(std::find(expected.begin(), expected.end(), unbound));
  expected.push_back(after);
  EXPECT_EQ(seen, expected);

  // A token that is no name under the prefix is refused, naming the prefix.
  options.page_token = "other/x";
  auto refused = client->ListPage("big/", options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("'big/'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("page_token"));
  // The last name as a token: nothing after it.
  options.page_token = after;
  auto past_the_end = client->ListPage("big/", options);
  ASSERT_TRUE(past_the_end.ok()) << past_the_end.status().ToString();
  EXPECT_TRUE(past_the_end->tensors.empty());
  EXPECT_TRUE(past_the_end->next_page_token.empty());
}

TEST(LargeAnswers, WatchSendsEveryInitialBindingAndTheChangesMeanwhile) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> names = LongNames("big", kManyNames);
  ASSERT_TRUE(PublishEmpty(*client, names).ok());
  auto before = client->List("big/");
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  std::map<std::string, uint64_t> initial_generation;
  for (const TensorInfo& info : *before) initial_generation[info.name] = info.generation;

  auto watcher = client->Watch("big/", /*initial=*/true);
  ASSERT_TRUE(watcher.ok()) << watcher.status().ToString();
  // Changes while the initial bindings are on their way: a re-publish, a delete and a new
  // name, then a last name that sorts after everything, so once it is seen every change
  // before it has been too.
  ASSERT_TRUE(PublishOne(*client, names[0]).ok());
  ASSERT_TRUE(client->Delete(names[kManyNames - 1]).ok());
  const std::string added = LongName("big", 1, 'y');
  const std::string last = LongName("big", 2, 'z');
  ASSERT_TRUE(PublishOne(*client, added).ok());
  ASSERT_TRUE(PublishOne(*client, last).ok());

  std::map<std::string, uint64_t> view;  // what the events say is bound
  std::map<std::string, uint64_t> last_generation;
  std::vector<std::string> initial_order;  // original names at their original generation
  std::map<std::string, int> initial_events;
  size_t events = 0;
  for (bool done = false; !done;) {
    auto event = (*watcher)->Next(10s);
    ASSERT_TRUE(event.ok()) << event.status().ToString();
    ASSERT_TRUE(event->has_value()) << "no event within 10 s after " << events;
    ++events;
    const WatchEvent& e = **event;
    ASSERT_NE(e.kind, WatchEvent::Kind::kReset) << "a RESET after " << events << " events";
    // A name's generation goes up with each binding; its UNBOUND carries the last one.
    if (e.kind == WatchEvent::Kind::kBound) {
      ASSERT_GT(e.generation, last_generation[e.name]) << e.name;
    } else {
      ASSERT_EQ(e.generation, last_generation[e.name]) << e.name;
    }
    last_generation[e.name] = e.generation;
    if (e.kind == WatchEvent::Kind::kBound) {
      view[e.name] = e.generation;
      auto original = initial_generation.find(e.name);
      if (original != initial_generation.end() && original->second == e.generation) {
        initial_order.push_back(e.name);
        ++initial_events[e.name];
      }
      done = e.name == last;
    } else {
      view.erase(e.name);
    }
  }
  EXPECT_TRUE(std::is_sorted(initial_order.begin(), initial_order.end()));
  for (const auto& [name, count] : initial_events) ASSERT_EQ(count, 1) << name << " came twice";
  // The events add up to what is bound now.
  auto now = client->List("big/");
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  std::map<std::string, uint64_t> bound;
  for (const TensorInfo& info : *now) bound[info.name] = info.generation;
  EXPECT_EQ(view.size(), bound.size());
  EXPECT_TRUE(view == bound) << "the watch's view differs from List";
  EXPECT_EQ(view.count(added), 1u);
  EXPECT_EQ(view.count(names[kManyNames - 1]), 0u);
}

TEST(LargeAnswers, TakeManyAnswersPastOneMessageArriveWhole) {
  DaemonProcess daemon;
  auto client = Connect(daemon);
  ASSERT_NE(client, nullptr);
  // 4096 takes of tensors with 200-byte names and 1 KiB of tags: about 5 MiB of answers.
  const std::vector<std::string> names = LongNames("q", 4096);
  ASSERT_TRUE(PublishEmpty(*client, names, {{"pad", std::string(1024, 'p')}}).ok());
  auto taken = client->TakeMany("q/", 4096);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  ASSERT_EQ(taken->size(), names.size());
  std::vector<std::string> taken_names;
  for (const TensorRef& ref : *taken) taken_names.push_back(ref.info().name);
  EXPECT_EQ(taken_names, names);  // oldest first: the order they were published in
  auto left = client->List("q/");
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_TRUE(left->empty());
}

}  // namespace
}  // namespace tensord
