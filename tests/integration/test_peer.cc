// tensord_test_peer: the other process in integration tests. Uses only the public client
// API (libtensord.so). Prints one line per step so the test can wait for it, then either
// exits or sleeps until it is killed.
//
//   produce SOCKET NAME COUNT VALUE      publish float32[COUNT] filled with VALUE, exit
//   hold SOCKET NAME                      acquire NAME, print "held <sum>", sleep
//   publish-many SOCKET NS COUNT          publish COUNT zero-byte tensors named
//                                         "NS/<190 letters>-<6 digits>" (about 200 bytes,
//                                         in index order), print "published <COUNT>", exit
//   allocate SOCKET NS COUNT              allocate without publishing, print "allocated <id>", sleep
//   recycle SOCKET NS COUNT               allocate float32[COUNT], release it unpublished (its
//                                         buffer waits in this session's pool), print
//                                         "pooled <buffer id> <recyclable 1/0>", sleep
//   hand-over SOCKET NAME TTL_MS          take NAME, hand it over for TTL_MS, release it,
//                                         print "token <token> <sum>", sleep
//   fork-hold SOCKET NAME                 acquire NAME; fork a child that acquires it again
//                                         with its own session; both sleep
//   fork-storm SOCKET NAME PREFIX ROUNDS  with a Watcher on PREFIX open and a thread taking
//                                         from PREFIX (waiting forever), fork 3 children
//                                         back to back per round, each acquiring NAME;
//                                         print "round <i>" after each; then "synced"
//                                         once the watcher saw a probe after the last
//                                         fork; then take until "<PREFIX>end" arrives and
//                                         print "storm <failed calls> <taken> <watch
//                                         events> <resets> <watcher saw the end: 1/0>"
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tensord/client.h"
#include "tests/integration/publish_filled.h"

namespace {

using tensord::testing::PublishFilled;

int Fail(const char* what, const tensord::Status& status) {
  std::printf("error %s: %s\n", what, status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

[[noreturn]] void SleepForever() {
  while (true) pause();
}

double Sum(const tensord::TensorRef& tensor) {
  const float* data = static_cast<const float*>(tensor.data());
  double sum = 0;
  for (int64_t i = 0; i < tensor.info().shape[0]; ++i) sum += data[i];
  return sum;
}

std::unique_ptr<tensord::Client> Connect(const char* socket) {
  tensord::ClientOptions options;
  options.socket_path = socket;
  auto client = tensord::Client::Connect(options);
  if (!client.ok()) {
    Fail("connect", client.status());
    std::exit(1);
  }
  return std::move(client).value();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: tensord_test_peer COMMAND SOCKET ARGS...\n");
    return 2;
  }
  std::string command = argv[1];
  auto client = Connect(argv[2]);
  if (command == "produce" && argc == 6) {
    auto published = PublishFilled(*client, argv[3], std::atoll(argv[4]), std::strtof(argv[5], nullptr));
    if (!published.ok()) return Fail("publish", published.status());
    Say("published " + std::to_string(published->tensor_id));
    return 0;
  }
  if (command == "publish-many" && argc == 5) {
    const std::string ns = argv[3];
    const size_t count = std::strtoull(argv[4], nullptr, 10);
    tensord::TensorSpec spec;
    spec.dtype = tensord::dtypes::kUInt8;
    spec.shape = {0};
    for (size_t first = 0; first < count; first += 4096) {
      const size_t n = std::min<size_t>(4096, count - first);
      auto refs = client->AllocateMany(ns, std::vector<tensord::TensorSpec>(n, spec));
      if (!refs.ok()) return Fail("allocate", refs.status());
      std::vector<std::string> names(n);
      std::vector<tensord::PublishItem> items;
      for (size_t i = 0; i < n; ++i) {
        char digits[16];
        std::snprintf(digits, sizeof(digits), "-%06zu", first + i);
        names[i] = ns + "/" + std::string(190, 'n') + digits;
        items.push_back(tensord::PublishItem{&(*refs)[i], names[i], {}});
      }
      auto published = client->PublishMany(items);
      if (!published.ok()) return Fail("publish", published.status());
    }
    if (tensord::Status flushed = client->Flush(); !flushed.ok()) return Fail("flush", flushed);
    Say("published " + std::to_string(count));
    return 0;
  }
  if (command == "hold" && argc == 4) {
    auto tensor = client->Acquire(argv[3]);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    Say("held " + std::to_string(Sum(*tensor)));
    SleepForever();
  }
  if (command == "allocate" && argc == 5) {
    tensord::TensorSpec spec;
    spec.shape = {std::atoll(argv[4])};
    auto tensor = client->Allocate(argv[3], spec);
    if (!tensor.ok()) return Fail("allocate", tensor.status());
    Say("allocated " + std::to_string(tensor->info().tensor_id));
    SleepForever();
  }
  if (command == "recycle" && argc == 5) {
    tensord::TensorSpec spec;
    spec.shape = {std::atoll(argv[4])};
    auto tensor = client->Allocate(argv[3], spec);
    if (!tensor.ok()) return Fail("allocate", tensor.status());
    const tensord::TensorInfo info = tensor->info();
    tensor->Release();
    if (tensord::Status flushed = client->Flush(); !flushed.ok()) return Fail("flush", flushed);
    Say("pooled " + std::to_string(info.buffer_id) + " " + (info.recyclable ? "1" : "0"));
    SleepForever();
  }
  if (command == "hand-over" && argc == 5) {
    auto tensor = client->Take(argv[3], tensord::Wait::For(std::chrono::seconds(20)));
    if (!tensor.ok()) return Fail("take", tensor.status());
    auto token = client->HandOver(*tensor, std::chrono::milliseconds(std::atoll(argv[4])));
    if (!token.ok()) return Fail("hand over", token.status());
    const double sum = Sum(*tensor);
    tensor->Release();  // the token holds it now
    if (tensord::Status flushed = client->Flush(); !flushed.ok()) return Fail("flush", flushed);
    Say("token " + token->token + " " + std::to_string(sum));
    SleepForever();
  }
  if (command == "fork-hold" && argc == 4) {
    auto tensor = client->Acquire(argv[3]);
    if (!tensor.ok()) return Fail("acquire", tensor.status());
    Say("parent-held " + std::to_string(client->session_id()));
    pid_t child = fork();
    if (child == 0) {
      // The child's client must open a session of its own on first use.
      auto again = client->Acquire(argv[3]);
      if (!again.ok()) return Fail("child acquire", again.status());
      Say("child-held " + std::to_string(client->session_id()) + " " + std::to_string(Sum(*again)) +
          " inherited " + std::to_string(Sum(*tensor)));
      SleepForever();
    }
    Say("forked " + std::to_string(child));
    SleepForever();
  }
  if (command == "fork-storm" && argc == 6) {
    const std::string name = argv[3];
    const std::string prefix = argv[4];
    const int rounds = std::atoi(argv[5]);
    auto watcher = client->Watch(prefix);
    if (!watcher.ok()) return Fail("watch", watcher.status());
    std::atomic<int> events{0};
    std::atomic<int> resets{0};
    std::atomic<bool> saw_end{false};
    std::atomic<int> last_sync{-1};  // the highest "<PREFIX>sync-<k>" the watcher saw bound
    std::thread watching([&] {
      // Until "<PREFIX>end" is seen bound, or 180 s (sanitized forks on a loaded machine are slow).
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
      while (std::chrono::steady_clock::now() < deadline) {
        auto event = (*watcher)->Next(std::chrono::milliseconds(50));
        if (!event.ok()) return;
        if (!event->has_value()) continue;
        ++events;
        if ((*event)->kind == tensord::WatchEvent::Kind::kReset) ++resets;
        if ((*event)->kind == tensord::WatchEvent::Kind::kBound && (*event)->name.starts_with(prefix + "sync-")) {
          last_sync.store(std::atoi((*event)->name.c_str() + prefix.size() + 5));
        }
        if ((*event)->kind == tensord::WatchEvent::Kind::kBound && (*event)->name == prefix + "end") {
          saw_end.store(true);
          return;
        }
      }
    });
    std::atomic<int> taken{0};
    std::thread taking([&] {
      while (true) {
        auto t = client->Take(prefix, tensord::Wait::Forever());
        if (!t.ok()) {
          Fail("take", t.status());
          return;
        }
        if (t->info().name == prefix + "end") return;
        if (!t->info().name.starts_with(prefix + "sync-")) ++taken;
      }
    });
    int failed = 0;
    for (int round = 0; round < rounds; ++round) {
      pid_t children[3];
      for (pid_t& child : children) {
        child = fork();
        if (child == 0) {
          tensord::AcquireOptions options;
          options.wait = tensord::Wait::For(std::chrono::seconds(10));
          auto t = client->Acquire(name, options);
          _exit(t.ok() ? 0 : 1);
        }
      }
      if (!client->Acquire(name).ok()) ++failed;
      for (pid_t child : children) {
        int status = 0;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
      }
      Say("round " + std::to_string(round));
    }
    // The watcher reopens its stream after each fork on its own thread. Before the end
    // marker goes out it must be back, or the marker could be published and taken while
    // the stream is down (the watcher would then rightly get only a RESET): publish probes
    // until it sees one.
    for (int k = 0; last_sync.load() < 0 && k < 600; ++k) {
      if (!PublishFilled(*client, prefix + "sync-" + std::to_string(k), 1, 1.0f).ok()) ++failed;
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      while (last_sync.load() < 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    Say(last_sync.load() >= 0 ? "synced" : "never synced");
    taking.join();
    watching.join();
    Say("storm " + std::to_string(failed) + " " + std::to_string(taken.load()) + " " +
        std::to_string(events.load()) + " " + std::to_string(resets.load()) + " " +
        std::to_string(saw_end.load() ? 1 : 0));
    return 0;
  }
  std::fprintf(stderr, "tensord_test_peer: bad command or arguments\n");
  return 2;
}
