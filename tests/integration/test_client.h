// A tensord::Client for tests against a DaemonProcess: the lease cache is off, so tests
// count leases exactly.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "gtest/gtest.h"
#include "tensord/client.h"
#include "tests/integration/daemon_fixture.h"

namespace tensord::testing {

inline ClientOptions Options(const DaemonProcess& daemon) {
  ClientOptions options;
  options.socket_path = daemon.socket();
  options.lease_cache = false;
  return options;
}

// Null, and a test failure, when the client cannot connect.
inline std::unique_ptr<Client> Connect(const DaemonProcess& daemon) {
  auto client = Client::Connect(Options(daemon));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(client).value() : nullptr;
}

// The backend `name` ("cuda", "level_zero") in a status; null when it is not listed.
inline const BackendInfo* FindBackend(const BrokerStatus& status, std::string_view name) {
  for (const BackendInfo& backend : status.backends) {
    if (backend.name == name) return &backend;
  }
  return nullptr;
}

// Stats tensor `tensor_id` until it is retired or 5 s pass (the daemon hears a producer's
// death on its own time); the last answer.
inline Result<TensorStat> WaitUntilRetired(Client& client, uint64_t tensor_id) {
  Result<TensorStat> stat = client.Stat(TensorId{tensor_id});
  for (int i = 0; i < 500 && stat.ok() && stat->info.state != TensorState::kRetired; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stat = client.Stat(TensorId{tensor_id});
  }
  return stat;
}

// Polls until tensor `tensor_id` has `holders` holders (true) or `timeout` passes (false).
inline bool WaitForHolders(Client& client, uint64_t tensor_id, size_t holders, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto stat = client.Stat(TensorId{tensor_id});
    if (stat.ok() && stat->holders.size() == holders) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Polls the broker's status until session `session_id` has `waiting` acquires and takes
// waiting at the broker, or `timeout` passes: a test that must act only once a wait is
// registered waits for that state instead of sleeping and hoping. The failure names the
// session and the count last seen.
inline ::testing::AssertionResult WaitForWaiting(Client& observer, uint64_t session_id, uint64_t waiting,
                                                 std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string seen = "no status";
  for (;;) {
    StatusOptions options;
    options.sessions = true;
    auto status = observer.GetStatus(options);
    if (status.ok()) {
      seen = "session not listed";
      for (const SessionUsage& usage : status->session_usage) {
        if (usage.id != session_id) continue;
        if (usage.waiting == waiting) return ::testing::AssertionSuccess();
        seen = std::to_string(usage.waiting) + " waiting";
      }
    } else {
      seen = status.status().ToString();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return ::testing::AssertionFailure() << "session " << session_id << " never had " << waiting
                                           << " acquires or takes waiting at the broker within "
                                           << timeout.count() << " ms; last seen: " << seen;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace tensord::testing
