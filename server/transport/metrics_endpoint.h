// MetricsEndpoint: the Prometheus scrape endpoint (--metrics-address), off by default. A
// plain HTTP/1.x server on one thread: GET /metrics answers 200 with the text format
// (version 0.0.4) from `render`; any other path 404, any other method 405; every answer
// closes its connection. It serves up to kMaxConnections connections at once, each given
// kRequestTimeout to send its request head (at most kMaxRequestBytes) and as long again to
// read the answer; when they are all taken, the one that has waited longest is dropped. So a
// scraper, which sends its request at once, is answered at once however many slow or
// half-open connections others keep open, and none of them ever blocks the broker.
// Thread-safe: Start and Stop from one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "server/transport/unix_socket.h"

namespace tensord::server {

struct MetricsAddress {
  std::string unix_path;  // unix:PATH
  std::string host;       // HOST:PORT; an IPv6 host without its brackets
  uint16_t port = 0;      // 0: any free port (the log says which)
};

// "HOST:PORT" (a name, an IPv4 address, or an IPv6 one in brackets: [::1]:9464) or
// "unix:PATH". INVALID_ARGUMENT saying what is wrong; the caller names where it came from.
absl::StatusOr<MetricsAddress> ParseMetricsAddress(std::string_view text);

class MetricsEndpoint {
 public:
  static constexpr std::chrono::seconds kRequestTimeout{2};
  static constexpr size_t kMaxRequestBytes = 8192;
  static constexpr size_t kMaxConnections = 64;
  using Render = std::function<std::string()>;

  MetricsEndpoint() = default;
  ~MetricsEndpoint() { Stop(); }
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Listens (a Unix socket with `mode` and `group`, as the daemon's own) and serves
  // `render()`'s text. Returns where it listens ("127.0.0.1:9464", "unix:/run/..."), with
  // the port the kernel chose for port 0.
  absl::StatusOr<std::string> Start(const MetricsAddress& address, mode_t mode, gid_t group, Render render);
  void Stop();

 private:
  using Clock = std::chrono::steady_clock;
  // One connection: its request head coming in, then its answer going out.
  struct Connection {
    common::UniqueFd fd;
    Clock::time_point deadline;  // for the head, then for the answer
    std::string request;
    std::string answer;
    size_t sent = 0;
    bool answering = false;
    bool done = false;  // to be closed
  };

  void Run();
  // Takes every pending connection, making room as the class comment says.
  void Accept(std::vector<Connection>& connections, Clock::time_point now);
  // Reads what came of the head, or writes what the peer takes of the answer.
  void Progress(Connection& connection, Clock::time_point now);
  std::string Answer(const std::string& request) const;

  ListeningSocket socket_;
  common::UniqueFd wake_fd_;
  Render render_;
  std::thread thread_;
};

}  // namespace tensord::server
