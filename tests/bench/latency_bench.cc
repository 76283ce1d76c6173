// tensord_latency_bench: measures, against a real daemon it starts on a private socket,
//   - repeated acquire+release of an already-published host tensor (one process, lease
//     cache off so every acquire is a broker round trip; and with the cache on),
//   - a first acquire in a new client (lease, description, fd, mapping),
//   - the time from kill -9 of a lease holder to the broker releasing its lease.
// Prints a table, or JSON with --json. Usage:
//   tensord_latency_bench [--json] [--iterations N] [--tensord PATH] [--peer PATH]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Row {
  std::string what;
  std::string size;
  double p50_us;
  double p99_us;
  int samples;
};

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t index = static_cast<size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

std::unique_ptr<tensord::Client> Connect(const std::string& socket, bool cache) {
  tensord::ClientOptions options;
  options.socket_path = socket;
  options.lease_cache = cache;
  auto client = tensord::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(client).value();
}

void Publish(tensord::Client& client, const std::string& name, int64_t bytes) {
  tensord::TensorSpec spec;
  spec.dtype = tensord::dtypes::kUInt8;
  spec.shape = {bytes};
  auto tensor = client.Allocate("bench", spec);
  if (!tensor.ok()) {
    std::fprintf(stderr, "allocate: %s\n", tensor.status().ToString().c_str());
    std::exit(1);
  }
  std::memset(tensor->mutable_data(), 1, static_cast<size_t>(bytes));
  auto published = client.Publish(*tensor, name);
  if (!published.ok()) std::exit(1);
}

std::string SizeName(int64_t bytes) {
  if (bytes >= (1 << 30)) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

Row RepeatedAcquire(const std::string& socket, const std::string& name, int64_t bytes, bool cache, int n) {
  auto client = Connect(socket, cache);
  std::vector<double> samples;
  volatile uint8_t sink = 0;
  for (int i = 0; i < n + n / 10; ++i) {
    auto start = Clock::now();
    auto tensor = client->Acquire(name);
    if (!tensor.ok()) std::exit(1);
    sink = sink + static_cast<const uint8_t*>(tensor->data())[0];  // read it
    tensor->Release();
    double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (i >= n / 10) samples.push_back(us);  // the first tenth warms up
  }
  return {cache ? "acquire+read+release (lease cache)" : "acquire+read+release (round trip)",
          SizeName(bytes), Percentile(samples, 0.5), Percentile(samples, 0.99), static_cast<int>(samples.size())};
}

Row FirstAcquire(const std::string& socket, const std::string& name, int64_t bytes, int n) {
  std::vector<double> samples;
  for (int i = 0; i < n; ++i) {
    auto client = Connect(socket, false);  // a fresh client maps nothing yet
    auto start = Clock::now();
    auto tensor = client->Acquire(name);
    if (!tensor.ok()) std::exit(1);
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return {"first acquire (lease, desc, fd, mmap)", SizeName(bytes), Percentile(samples, 0.5),
          Percentile(samples, 0.99), n};
}

Row KillToRelease(const std::string& socket, const std::string& peer, int n) {
  auto client = Connect(socket, false);
  Publish(*client, "bench/held", 4096);
  std::vector<double> samples;
  for (int i = 0; i < n; ++i) {
    tensord::testing::ChildProcess holder({peer, "hold", socket, "bench/held"});
    if (holder.WaitForLine("held").empty()) std::exit(1);
    auto start = Clock::now();
    ::kill(holder.pid(), SIGKILL);
    while (true) {
      auto stat = client->Stat("bench/held");
      if (stat.ok() && stat->info.lease_count == 0) break;
      if (Clock::now() - start > 10s) std::exit(1);
    }
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    holder.Wait();
  }
  return {"kill -9 of a holder -> lease released", "", Percentile(samples, 0.5), Percentile(samples, 0.99), n};
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int iterations = 2000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) json = true;
    else if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) iterations = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--json] [--iterations N]\n", argv[0]);
      return 2;
    }
  }
  tensord::testing::DaemonProcess daemon;
  const std::string& socket = daemon.socket();
  std::vector<Row> rows;
  {
    auto producer = Connect(socket, false);
    for (int64_t bytes : {int64_t{4} << 10, int64_t{1} << 20, int64_t{64} << 20}) {
      std::string name = "bench/t" + std::to_string(bytes);
      Publish(*producer, name, bytes);
      rows.push_back(RepeatedAcquire(socket, name, bytes, false, iterations));
      rows.push_back(RepeatedAcquire(socket, name, bytes, true, iterations));
      rows.push_back(FirstAcquire(socket, name, bytes, std::max(20, iterations / 20)));
    }
  }
  rows.push_back(KillToRelease(socket, TENSORD_TEST_PEER, 30));

  if (json) {
    std::printf("[\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      std::printf("  {\"what\": \"%s\", \"size\": \"%s\", \"p50_us\": %.1f, \"p99_us\": %.1f, \"samples\": %d}%s\n",
                  rows[i].what.c_str(), rows[i].size.c_str(), rows[i].p50_us, rows[i].p99_us,
                  rows[i].samples, i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
  } else {
    std::printf("%-42s %-8s %10s %10s %8s\n", "measurement", "size", "p50 (us)", "p99 (us)", "samples");
    for (const Row& row : rows) {
      std::printf("%-42s %-8s %10.1f %10.1f %8d\n", row.what.c_str(), row.size.c_str(), row.p50_us,
                  row.p99_us, row.samples);
    }
  }
  return 0;
}
