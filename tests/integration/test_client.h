// A tensord::Client for tests against a DaemonProcess: the lease cache is off, so tests
// count leases exactly.
#pragma once

#include <memory>

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

}  // namespace tensord::testing
