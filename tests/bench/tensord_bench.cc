// tensord_bench: the in-process figures of the comparative benchmark (issue 5), with
// Google Benchmark. It starts its own daemon on a private socket and measures, as
// p50/p99 counters (microseconds) besides Google Benchmark's mean:
//   floor/*                         the floors (see floors.h);
//   tensord/connect                 Client::Connect (fd-channel HELLO, gRPC channel);
//   tensord/acquire_first/SIZE      the first Acquire of a new client, plus reading the
//                                   first byte: session stream, lease, description, fd,
//                                   mapping;
//   tensord/acquire_unmapped/SIZE   an Acquire (+ first byte) in a warm client of a tensor
//                                   it has no mapping of: lease, description, fd, mapping;
//   tensord/acquire_repeated/SIZE/cache:0|1
//                                   Acquire + read the first byte + Release of an unchanged
//                                   tensor, lease cache off (a round trip) or on;
//   tensord/allocate_publish/SIZE   Allocate then Publish (counters split the two);
//   tensord/release_flush           Release + Flush: until the broker has the release;
//   tensord/kill9_release/LEASES    kill -9 of a process holding LEASES leases until a Stat
//                                   shows them released (also: until the kernel reaped it);
//   tensord/memory_per_lease        daemon RSS growth per live lease, with --leases leases.
// SIZE is 4KiB, 1MiB, 256MiB, 1GiB for dedicated buffers and 4KiB-arena, 1MiB-arena for
// tensors carved out of the namespace's arena.
//
// Usage: tensord_bench [--quick] [--tensord PATH] [--peer PATH] [--lease-flood PATH]
//                      [--leases N] [Google Benchmark flags, e.g. --benchmark_format=json]
// --quick runs every benchmark a few times only (the bench_smoke test).
#include <sys/wait.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tensord/client.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/floors.h"
#include "tests/integration/proc_info.h"

namespace tensord::bench {
namespace {

using namespace std::chrono_literals;

struct Options {
  Scale scale;
  std::string tensord = TENSORD_BIN;
  std::string peer = TENSORD_TEST_PEER;
  std::string lease_flood = TENSORD_LEASE_FLOOD;
  int64_t leases = 1000000;
};

struct Size {
  std::string label;
  int64_t bytes;
  bool arena;
};

const std::vector<Size>& Sizes() {
  static const std::vector<Size> sizes = {
      {"4KiB-arena", 4 << 10, true}, {"4KiB", 4 << 10, false},    {"1MiB-arena", 1 << 20, true},
      {"1MiB", 1 << 20, false},      {"256MiB", 256 << 20, false}, {"1GiB", int64_t{1} << 30, false},
  };
  return sizes;
}

// The daemon on a private socket; SIGTERM at the end, and it must exit 0.
class Daemon {
 public:
  explicit Daemon(const std::string& binary) : socket_(dir_.path() + "/tensord.sock") {
    process_ = std::make_unique<Process>(
        std::vector<std::string>{binary, "--socket", socket_, "--log-level", "warn"});
    for (int i = 0; i < 1000; ++i) {
      if (std::filesystem::exists(socket_) && std::filesystem::exists(socket_ + ".fd")) {
        ClientOptions options;
        options.socket_path = socket_;
        if (Client::Connect(options).ok()) return;
      }
      int status;
      if (process_->WaitFor(0ms, &status)) Die("tensord exited at start, status " + std::to_string(status));
      std::this_thread::sleep_for(10ms);
    }
    Die("tensord did not start serving on " + socket_);
  }
  // Whether it stopped cleanly on SIGTERM.
  bool Stop() {
    process_->Signal(SIGTERM);
    int status = 0;
    if (!process_->WaitFor(10s, &status)) {
      std::fprintf(stderr, "tensord_bench: the daemon did not exit on SIGTERM\n");
      return false;
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  const std::string& socket() const { return socket_; }
  pid_t pid() const { return process_->pid(); }

 private:
  TempDir dir_;
  std::string socket_;
  std::unique_ptr<Process> process_;
};

// What the tensord benchmarks share: the options, the daemon (started on first use), a
// producer client that keeps the published tensors' bindings company.
class Env {
 public:
  explicit Env(Options options) : options_(std::move(options)) {}
  const Options& options() const { return options_; }
  Daemon& daemon() {
    if (daemon_ == nullptr) daemon_ = std::make_unique<Daemon>(options_.tensord);
    return *daemon_;
  }
  std::unique_ptr<Client> Connect(bool lease_cache) {
    ClientOptions client_options;
    client_options.socket_path = daemon().socket();
    client_options.lease_cache = lease_cache;
    client_options.client_name = "tensord_bench";
    auto client = Client::Connect(client_options);
    if (!client.ok()) Die("connect: " + client.status().ToString());
    return std::move(client).value();
  }
  Client& producer() {
    if (producer_ == nullptr) producer_ = Connect(false);
    return *producer_;
  }
  // The name of a published tensor of this size, filled with ones; published once.
  std::string Published(const Size& size) {
    std::string name = "bench/" + size.label;
    if (published_.insert(name).second) Publish(producer(), name, size);
    return name;
  }
  // A float32 tensor of ones in its own buffer, for tensord_test_peer (which sums it as
  // float32); published once.
  std::string PublishedFloats() {
    const std::string name = "bench/held";
    if (published_.insert(name).second) {
      TensorSpec spec;
      spec.dtype = dtypes::kFloat32;
      spec.shape = {1024};
      spec.isolated = true;
      auto tensor = producer().Allocate("bench", spec);
      if (!tensor.ok()) Die("allocate " + name + ": " + tensor.status().ToString());
      float* data = static_cast<float*>(tensor->mutable_data());
      for (int i = 0; i < 1024; ++i) data[i] = 1.0f;
      auto published = producer().Publish(*tensor, name);
      if (!published.ok()) Die("publish " + name + ": " + published.status().ToString());
    }
    return name;
  }
  static TensorRef Allocate(Client& client, const Size& size) {
    TensorSpec spec;
    spec.dtype = dtypes::kUInt8;
    spec.shape = {size.bytes};
    spec.isolated = !size.arena;
    auto tensor = client.Allocate("bench", spec);
    if (!tensor.ok()) Die("allocate " + size.label + ": " + tensor.status().ToString());
    return std::move(tensor).value();
  }
  static void Publish(Client& client, const std::string& name, const Size& size) {
    TensorRef tensor = Allocate(client, size);
    std::memset(tensor.mutable_data(), 1, static_cast<size_t>(size.bytes));
    auto published = client.Publish(tensor, name);
    if (!published.ok()) Die("publish " + name + ": " + published.status().ToString());
  }
  // Ends everything; false when the daemon did not stop cleanly.
  bool Stop() {
    producer_.reset();
    return daemon_ == nullptr || daemon_->Stop();
  }

 private:
  Options options_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<Client> producer_;
  std::set<std::string> published_;
};

Env* env = nullptr;

TensorRef MustAcquire(Client& client, const std::string& name) {
  auto tensor = client.Acquire(name);
  if (!tensor.ok()) Die("acquire " + name + ": " + tensor.status().ToString());
  return std::move(tensor).value();
}

uint8_t FirstByte(const TensorRef& tensor) { return *static_cast<const volatile uint8_t*>(tensor.data()); }

void CheckRead(uint8_t value) {
  if (value != 1) Die("read " + std::to_string(value) + " where 1 was written");
}

void ReportBuffer(benchmark::State& state, const TensorRef& tensor) {
  state.counters["buffer_bytes"] = static_cast<double>(tensor.info().buffer_size);
}

void ConnectBench(benchmark::State& state) {
  env->daemon();
  Samples samples(state.max_iterations);
  for (auto _ : state) {
    std::unique_ptr<Client> client;
    TimeIteration(state, samples, [&] { client = env->Connect(true); });
  }
  samples.Report(state);
}

void AcquireFirst(benchmark::State& state, const Size& size) {
  const std::string name = env->Published(size);
  Samples samples(state.max_iterations);
  for (auto _ : state) {
    auto client = env->Connect(true);
    TensorRef tensor;
    uint8_t value = 0;
    TimeIteration(state, samples, [&] {
      tensor = MustAcquire(*client, name);
      value = FirstByte(tensor);
    });
    CheckRead(value);
    ReportBuffer(state, tensor);
  }
  samples.Report(state);
}

void AcquireUnmapped(benchmark::State& state, const Size& size) {
  const std::string name = env->Published(size);
  auto client = env->Connect(false);
  // The session stream is up before the first sample.
  MustAcquire(*client, env->Published(Sizes()[0])).Release();
  Samples samples(state.max_iterations);
  for (auto _ : state) {
    TensorRef tensor;
    uint8_t value = 0;
    TimeIteration(state, samples, [&] {
      tensor = MustAcquire(*client, name);
      value = FirstByte(tensor);
    });
    CheckRead(value);
    ReportBuffer(state, tensor);
    // Released and flushed: the last view of a dedicated buffer unmaps it.
    tensor.Release();
    if (auto flushed = client->Flush(); !flushed.ok()) Die("flush: " + flushed.ToString());
  }
  samples.Report(state);
}

void AcquireRepeated(benchmark::State& state, const Size& size, bool cache) {
  const std::string name = env->Published(size);
  auto client = env->Connect(cache);
  const int64_t warmup = std::max<int64_t>(5, state.max_iterations / 10);
  for (int64_t i = 0; i < warmup; ++i) CheckRead(FirstByte(MustAcquire(*client, name)));
  Samples samples(state.max_iterations);
  for (auto _ : state) {
    uint8_t value = 0;
    TimeIteration(state, samples, [&] {
      TensorRef tensor = MustAcquire(*client, name);
      value = FirstByte(tensor);
      tensor.Release();
    });
    CheckRead(value);
  }
  samples.Report(state);
}

void AllocatePublish(benchmark::State& state, const Size& size) {
  Client& client = env->producer();
  const std::string name = "bench/pub/" + size.label;
  Samples samples(state.max_iterations);
  Samples allocate(state.max_iterations);
  Samples publish(state.max_iterations);
  for (auto _ : state) {
    const auto start = Clock::now();
    TensorRef tensor = Env::Allocate(client, size);
    const auto allocated = Clock::now();
    auto published = client.Publish(tensor, name);
    const auto done = Clock::now();
    if (!published.ok()) Die("publish " + name + ": " + published.status().ToString());
    samples.Add(done - start);
    allocate.Add(allocated - start);
    publish.Add(done - allocated);
    state.SetIterationTime(std::chrono::duration<double>(done - start).count());
  }
  samples.Report(state);
  state.counters["allocate_p50_us"] = allocate.Percentile(0.5);
  state.counters["allocate_p99_us"] = allocate.Percentile(0.99);
  state.counters["publish_p50_us"] = publish.Percentile(0.5);
  state.counters["publish_p99_us"] = publish.Percentile(0.99);
  if (auto deleted = client.Delete(name); !deleted.ok()) Die("delete " + name + ": " + deleted.ToString());
}

void ReleaseFlush(benchmark::State& state) {
  const std::string name = env->Published(Sizes()[1]);
  auto client = env->Connect(false);
  Samples samples(state.max_iterations);
  for (auto _ : state) {
    TensorRef tensor = MustAcquire(*client, name);
    TimeIteration(state, samples, [&] {
      tensor.Release();
      if (auto flushed = client->Flush(); !flushed.ok()) Die("flush: " + flushed.ToString());
    });
  }
  samples.Report(state);
}

void KillToRelease(benchmark::State& state, int64_t leases) {
  const std::string name = env->PublishedFloats();
  auto observer = env->Connect(false);
  const Options& options = env->options();
  Samples samples(state.max_iterations);
  Samples reaped(state.max_iterations);
  for (auto _ : state) {
    std::vector<std::string> argv =
        leases == 1 ? std::vector<std::string>{options.peer, "hold", env->daemon().socket(), name}
                    : std::vector<std::string>{options.lease_flood, env->daemon().socket(), "1",
                                               std::to_string(leases), name};
    Process holder(argv);
    holder.WaitForLine("held", 120s);
    auto stat = observer->Stat(name);
    if (!stat.ok() || stat->info.lease_count < leases) Die("the holder's leases are not all there");
    const auto start = Clock::now();
    holder.Signal(SIGKILL);
    std::optional<Clock::duration> gone;
    std::optional<Clock::duration> released;
    while (!gone || !released) {
      int status;
      if (!gone && holder.WaitFor(0ms, &status)) gone = Clock::now() - start;
      if (!released) {
        stat = observer->Stat(name);
        if (!stat.ok()) Die("stat: " + stat.status().ToString());
        if (stat->info.lease_count == 0) released = Clock::now() - start;
      }
      if (Clock::now() - start > 30s) Die("the killed holder's leases were not released in 30 s");
    }
    samples.Add(*released);
    reaped.Add(*gone);
    state.SetIterationTime(std::chrono::duration<double>(*released).count());
  }
  samples.Report(state);
  state.counters["reaped_p50_us"] = reaped.Percentile(0.5);
  state.counters["reaped_p99_us"] = reaped.Percentile(0.99);
  state.counters["leases"] = static_cast<double>(leases);
}

// VmRSS of a process in bytes.
uint64_t ResidentBytes(pid_t pid) {
  int64_t kib = testing::RssKiB(pid);
  if (kib < 0) Die("no VmRSS for pid " + std::to_string(pid));
  return static_cast<uint64_t>(kib) * 1024;
}

// The leases held on `names`, from Stat.
uint64_t LeasesOn(Client& observer, const std::vector<std::string>& names) {
  uint64_t leases = 0;
  for (const std::string& name : names) {
    auto stat = observer.Stat(name);
    if (!stat.ok()) Die("stat " + name + ": " + stat.status().ToString());
    leases += stat->info.lease_count;
  }
  return leases;
}

void MemoryPerLease(benchmark::State& state) {
  const Options& options = env->options();
  const int64_t sessions = 4;
  const int64_t per_session = std::max<int64_t>(1, options.scale.Pick(options.leases, 20000) / sessions);
  const uint64_t expected = static_cast<uint64_t>(sessions * per_session);
  std::vector<std::string> names;  // only the flood acquires these
  for (int i = 0; i < 4; ++i) names.push_back(env->Published(Size{"mem" + std::to_string(i), 1024, false}));
  if (auto flushed = env->producer().Flush(); !flushed.ok()) Die("flush: " + flushed.ToString());
  std::vector<std::string> argv = {options.lease_flood, env->daemon().socket(), std::to_string(sessions),
                                   std::to_string(per_session)};
  argv.insert(argv.end(), names.begin(), names.end());
  auto observer = env->Connect(false);
  for (auto _ : state) {
    if (LeasesOn(*observer, names) != 0) Die("leases on the flood's tensors before the flood");
    const uint64_t rss_before = ResidentBytes(env->daemon().pid());
    const auto start = Clock::now();
    Process flood(argv);
    flood.WaitForLine("held", 600s);
    const auto held_at = Clock::now();
    const uint64_t rss_held = ResidentBytes(env->daemon().pid());
    const uint64_t leases = LeasesOn(*observer, names);
    if (leases != expected) {
      Die("the flood holds " + std::to_string(leases) + " leases, not " + std::to_string(expected));
    }
    const auto kill_at = Clock::now();
    flood.Signal(SIGKILL);
    while (LeasesOn(*observer, names) != 0) {
      if (Clock::now() - kill_at > 120s) Die("the flood's leases were not released in 120 s");
    }
    const auto released_at = Clock::now();
    state.SetIterationTime(std::chrono::duration<double>(held_at - start).count());
    state.counters["leases"] = static_cast<double>(leases);
    state.counters["rss_before_MiB"] = rss_before / 1048576.0;
    state.counters["rss_held_MiB"] = rss_held / 1048576.0;
    state.counters["bytes_per_lease"] =
        (static_cast<double>(rss_held) - static_cast<double>(rss_before)) / static_cast<double>(leases);
    state.counters["release_all_ms"] = std::chrono::duration<double, std::milli>(released_at - kill_at).count();
  }
}

void Register(const Scale& scale) {
  auto add = [](const std::string& name, auto function, int64_t iterations) {
    benchmark::RegisterBenchmark(name.c_str(), function)
        ->Iterations(iterations)->UseManualTime()->Unit(benchmark::kMicrosecond);
  };
  add("tensord/connect", ConnectBench, scale.Pick(100, 3));
  for (const Size& size : Sizes()) {
    add("tensord/acquire_first/" + size.label, [&size](benchmark::State& s) { AcquireFirst(s, size); },
        scale.Pick(100, 3));
  }
  for (const Size& size : Sizes()) {
    if (size.arena) continue;  // an arena stays mapped in a warm client
    add("tensord/acquire_unmapped/" + size.label, [&size](benchmark::State& s) { AcquireUnmapped(s, size); },
        scale.Pick(size.bytes >= (256 << 20) ? 100 : 500, 3));
  }
  for (const Size& size : Sizes()) {
    for (bool cache : {false, true}) {
      add("tensord/acquire_repeated/" + size.label + "/cache:" + (cache ? "1" : "0"),
          [&size, cache](benchmark::State& s) { AcquireRepeated(s, size, cache); },
          scale.Pick(cache ? 20000 : 3000, 10));
    }
  }
  for (const Size& size : Sizes()) {
    int64_t full = size.bytes >= (int64_t{1} << 30) ? 5 : size.bytes >= (256 << 20) ? 20 : 300;
    add("tensord/allocate_publish/" + size.label, [&size](benchmark::State& s) { AllocatePublish(s, size); },
        scale.Pick(full, 2));
  }
  add("tensord/release_flush", ReleaseFlush, scale.Pick(2000, 10));
  add("tensord/kill9_release/1", [](benchmark::State& s) { KillToRelease(s, 1); }, scale.Pick(30, 2));
  add("tensord/kill9_release/10000", [](benchmark::State& s) { KillToRelease(s, 10000); }, scale.Pick(10, 1));
  add("tensord/memory_per_lease", MemoryPerLease, 1);
}

[[noreturn]] void Usage(const char* program) {
  std::fprintf(stderr,
               "usage: %s [--quick] [--tensord PATH] [--peer PATH] [--lease-flood PATH] [--leases N]\n"
               "          [Google Benchmark flags]\n",
               program);
  std::exit(2);
}

}  // namespace
}  // namespace tensord::bench

int main(int argc, char** argv) {
  using namespace tensord::bench;
  if (argc == 4 && std::strcmp(argv[1], "--serve") == 0) return RunFloorServer(argv[2], argv[3]);
  Options options;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(argv[0]);
      return argv[++i];
    };
    if (arg == "--quick") options.scale.quick = true;
    else if (arg == "--tensord") options.tensord = value();
    else if (arg == "--peer") options.peer = value();
    else if (arg == "--lease-flood") options.lease_flood = value();
    else if (arg == "--leases") options.leases = std::stoll(value());
    else if (arg == "--help" || arg == "-h") Usage(argv[0]);
    else rest.push_back(argv[i]);
  }
  int rest_count = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_count, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_count, rest.data())) return 2;
  RegisterFloors(options.scale);
  Register(options.scale);
  Env shared(options);
  env = &shared;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return shared.Stop() ? 0 : 1;
}
