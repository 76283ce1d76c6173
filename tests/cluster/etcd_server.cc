#include "tests/cluster/etcd_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/cluster/etcd_client.h"

extern char** environ;

namespace tensord::testing {
namespace {

// A loopback port nobody listens on now (the kernel's pick; etcd binds it right after).
absl::StatusOr<int> FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    return absl::InternalError("bind a loopback port");
  }
  close(fd);
  return ntohs(address.sin_port);
}

// Whether something accepts TCP connections on the endpoint's port (before etcd does, gRPC's
// first attempts fail and its channel waits out a reconnect backoff).
bool Listening(const std::string& endpoint) {
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return ok;
}

}  // namespace

std::string EtcdServer::Binary() { return TENSORD_ETCD_BIN; }

absl::StatusOr<EtcdServer> EtcdServer::Prepare(std::string name, std::optional<TestCertificates> tls) {
  if (Binary().empty()) return absl::UnavailableError("no etcd binary (Debian: etcd-server)");
  EtcdServer server;
  server.tls_ = std::move(tls);
  server.name_ = std::move(name);
  char dir_template[] = "/tmp/tensord-etcd-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp");
  server.data_dir_ = dir_template;
  absl::StatusOr<int> client_port = FreePort();
  absl::StatusOr<int> peer_port = FreePort();
  if (!client_port.ok() || !peer_port.ok()) return absl::InternalError("no free loopback port");
  server.endpoint_ = absl::StrCat(server.tls_ ? "https" : "http", "://127.0.0.1:", *client_port);
  server.peer_url_ = absl::StrCat("http://127.0.0.1:", *peer_port);
  server.initial_cluster_ = absl::StrCat(server.name_, "=", server.peer_url_);
  return server;
}

absl::StatusOr<EtcdServer> EtcdServer::Start(std::optional<TestCertificates> tls) {
  absl::StatusOr<EtcdServer> server = Prepare("test", std::move(tls));
  if (!server.ok()) return server.status();
  if (absl::Status launched = server->Launch(); !launched.ok()) return launched;
  if (absl::Status answered = server->AwaitAnswer(); !answered.ok()) return answered;
  return server;
}

absl::StatusOr<std::vector<EtcdServer>> EtcdServer::StartMembers(int count, std::optional<TestCertificates> tls) {
  std::vector<EtcdServer> members;
  std::vector<std::string> cluster;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<EtcdServer> member = Prepare(absl::StrCat("member", i), tls);
    if (!member.ok()) return member.status();
    cluster.push_back(member->initial_cluster_);
    members.push_back(*std::move(member));
  }
  // Every member starts before any can answer: etcd answers once a quorum has formed.
  for (EtcdServer& member : members) {
    member.initial_cluster_ = absl::StrJoin(cluster, ",");
    if (absl::Status launched = member.Launch(); !launched.ok()) return launched;
  }
  for (EtcdServer& member : members) {
    if (absl::Status answered = member.AwaitAnswer(); !answered.ok()) return answered;
  }
  return members;
}

EtcdServer::EtcdServer(EtcdServer&& other) noexcept
    : tls_(std::move(other.tls_)),
      data_dir_(std::move(other.data_dir_)),
      endpoint_(std::move(other.endpoint_)),
      peer_url_(std::move(other.peer_url_)),
      name_(std::move(other.name_)),
      initial_cluster_(std::move(other.initial_cluster_)),
      pid_(std::exchange(other.pid_, -1)) {}

EtcdServer::~EtcdServer() {
  Kill();
  if (!data_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(data_dir_, ignored);
  }
}

absl::Status EtcdServer::Launch() {
  std::vector<std::string> args = {Binary(),
                                   absl::StrCat("--name=", name_),
                                   absl::StrCat("--data-dir=", data_dir_, "/data"),
                                   absl::StrCat("--listen-client-urls=", endpoint_),
                                   absl::StrCat("--advertise-client-urls=", endpoint_),
                                   absl::StrCat("--listen-peer-urls=", peer_url_),
                                   absl::StrCat("--initial-advertise-peer-urls=", peer_url_),
                                   absl::StrCat("--initial-cluster=", initial_cluster_),
                                   "--initial-cluster-token=tensord-test",
                                   "--logger=zap",
                                   "--log-level=error",
                                   absl::StrCat("--log-outputs=", data_dir_, "/etcd.log")};
  if (tls_) {
    args.push_back(absl::StrCat("--cert-file=", tls_->server_cert));
    args.push_back(absl::StrCat("--key-file=", tls_->server_key));
    args.push_back(absl::StrCat("--trusted-ca-file=", tls_->ca));
    args.push_back("--client-cert-auth");
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return absl::InternalError(absl::StrCat("spawn ", Binary(), ": ", strerror(rc)));
  return absl::OkStatus();
}

server::cluster::EtcdOptions EtcdServer::ClientOptions() const {
  server::cluster::EtcdOptions options{.endpoints = {endpoint_}, .call_timeout = absl::Seconds(2)};
  if (tls_) {
    options.ca_file = tls_->ca;
    options.cert_file = tls_->client_cert;
    options.key_file = tls_->client_key;
  }
  return options;
}

absl::Status EtcdServer::AwaitAnswer() {
  server::cluster::EtcdOptions options = ClientOptions();
  options.call_timeout = absl::Seconds(1);
  auto client = server::cluster::EtcdClient::Create(options);
  if (!client.ok()) return client.status();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  absl::Status last;
  while (std::chrono::steady_clock::now() < give_up) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("etcd exited at start (status ", status, "); see ", data_dir_,
                                              "/etcd.log"));
    }
    if (!Listening(endpoint_)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    last = (*client)->Get("tensord-test/ping").status();
    if (last.ok()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("etcd did not answer within 30 s: ", last.message()));
}

void EtcdServer::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGCONT);
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void EtcdServer::Pause() {
  if (pid_ > 0) kill(pid_, SIGSTOP);
}

void EtcdServer::Resume() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

absl::Status EtcdServer::Restart() {
  Kill();
  if (absl::Status launched = Launch(); !launched.ok()) return launched;
  return AwaitAnswer();
}

}  // namespace tensord::testing
