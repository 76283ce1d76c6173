// EtcdTest: a fixture with a real etcd of the test's own (EtcdServer) and a client of it;
// every case skips, saying why, where no etcd binary was found at configure time. Recorder:
// what a watch delivered.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd_client.h"
#include "server/cluster/etcd_watch.h"
#include "tests/cluster/etcd_server.h"

namespace tensord::server::cluster {

using ::tensord::testing::EtcdServer;

// What a watch delivered, as "put KEY=VALUE" / "delete KEY" lines.
class Recorder {
 public:
  EtcdWatch::EventsCallback Callback() {
    return [this](std::vector<EtcdEvent> events) {
      absl::MutexLock lock(&mu_);
      for (const EtcdEvent& e : events) {
        lines_.push_back(e.kind == EtcdEvent::Kind::kPut ? "put " + e.kv.key + "=" + e.kv.value
                                                         : "delete " + e.kv.key);
      }
    };
  }
  // Waits up to 10 s for `count` lines; returns what came.
  std::vector<std::string> Await(size_t count) {
    absl::MutexLock lock(&mu_);
    wanted_ = count;
    mu_.AwaitWithTimeout(absl::Condition(this, &Recorder::Enough), absl::Seconds(10));
    return lines_;
  }
  std::vector<std::string> Lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  bool Enough() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return lines_.size() >= wanted_; }

  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  size_t wanted_ ABSL_GUARDED_BY(mu_) = 0;
};

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdServer::Binary().empty()) {
      GTEST_SKIP() << "no etcd binary was found at configure time (Debian: etcd-server, which "
                      "deploy/install-deps.sh installs)";
    }
    absl::StatusOr<EtcdServer> server = EtcdServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_.emplace(std::move(*server));
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(server_->ClientOptions());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  // Waits up to `limit` for the key to be gone; returns how long it took.
  absl::StatusOr<absl::Duration> AwaitGone(std::string_view key, absl::Duration limit) {
    const absl::Time start = absl::Now();
    while (absl::Now() - start < limit) {
      absl::StatusOr<std::optional<EtcdKeyValue>> kv = client_->Get(key);
      if (!kv.ok()) return kv.status();
      if (!kv->has_value()) return absl::Now() - start;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return absl::DeadlineExceededError("still there");
  }

  std::optional<EtcdServer> server_;
  std::unique_ptr<EtcdClient> client_;
};

}  // namespace tensord::server::cluster
