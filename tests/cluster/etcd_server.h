// EtcdServer: a real etcd (Debian's etcd-server) for a test, on loopback ports of its own
// with a data directory of its own, started and stopped by the test. Pause()/Resume()
// freeze it (SIGSTOP/SIGCONT): an etcd that answers nothing, as one cut off would. With
// certificates it serves https only and asks every client for a certificate signed by the
// CA (--client-cert-auth).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/cluster/etcd_client.h"
#include "tests/cluster/test_certs.h"

namespace tensord::testing {

class EtcdServer {
 public:
  // The etcd binary found at configure time; empty when none was.
  static std::string Binary();
  // Starts etcd and waits (up to 30 s) until it answers.
  static absl::StatusOr<EtcdServer> Start(std::optional<TestCertificates> tls = std::nullopt);
  // Starts the `count` members of one etcd cluster and waits until each answers.
  static absl::StatusOr<std::vector<EtcdServer>> StartMembers(int count,
                                                              std::optional<TestCertificates> tls = std::nullopt);
  EtcdServer(EtcdServer&& other) noexcept;
  EtcdServer& operator=(EtcdServer&&) = delete;
  ~EtcdServer();

  // "http://127.0.0.1:PORT", or https.
  const std::string& endpoint() const { return endpoint_; }
  // What a client needs to reach it: the endpoint and, with TLS, the CA and the good client
  // certificate.
  server::cluster::EtcdOptions ClientOptions() const;
  void Pause();
  void Resume();
  // Kills it (SIGKILL) and starts it again on the same ports and data.
  absl::Status Restart();
  // Kills it (SIGKILL); the destructor or Restart() may follow.
  void Stop() { Kill(); }

 private:
  EtcdServer() = default;
  // Sets up the data directory and ports of a server named `name`.
  static absl::StatusOr<EtcdServer> Prepare(std::string name, std::optional<TestCertificates> tls);
  absl::Status Launch();
  absl::Status AwaitAnswer();
  void Kill();

  std::optional<TestCertificates> tls_;
  std::string data_dir_;
  std::string endpoint_;
  std::string peer_url_;
  std::string name_;
  std::string initial_cluster_;  // NAME=PEER_URL of every member
  pid_t pid_ = -1;
};

}  // namespace tensord::testing
