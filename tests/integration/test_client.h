// A tensord::Client for tests against a DaemonProcess: the lease cache is off, so tests
// count leases exactly.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
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

}  // namespace tensord::testing
