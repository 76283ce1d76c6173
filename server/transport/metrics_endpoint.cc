#include "server/transport/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace tensord::server {
namespace {

using Clock = std::chrono::steady_clock;

int MillisLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

std::string Response(std::string_view status, std::string_view content_type, std::string_view body) {
  return absl::StrCat("HTTP/1.1 ", std::string(status), "\r\nContent-Type: ", std::string(content_type),
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", std::string(body));
}

absl::StatusOr<ListeningSocket> ListenTcp(const MetricsAddress& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  const std::string where = absl::StrCat("metrics address ", address.host, ":", address.port);
  if (int rc = getaddrinfo(address.host.empty() ? nullptr : address.host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, &freeaddrinfo);
  // No host (":9464") means every address: IPv6's wildcard with IPV6_V6ONLY off takes IPv4
  // too, so it is tried first; IPv4's alone where the machine has no IPv6.
  std::vector<addrinfo*> candidates;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) candidates.push_back(ai);
  const bool every_address = address.host.empty();
  if (every_address) {
    std::stable_partition(candidates.begin(), candidates.end(),
                          [](const addrinfo* ai) { return ai->ai_family == AF_INET6; });
  }
  int last_errno = 0;
  for (addrinfo* ai : candidates) {
    common::UniqueFd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (every_address && ai->ai_family == AF_INET6) {
      int zero = 0;
      if (setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) != 0) {
        last_errno = errno;
        continue;
      }
    }
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd.get(), 16) != 0) {
      last_errno = errno;
      continue;
    }
    return ListeningSocket{std::move(fd), "", false};
  }
  return common::ErrnoToStatus(absl::StrCat("listen on ", where), last_errno);
}

// Where a TCP socket listens, as HOST:PORT.
std::string BoundAddress(int fd) {
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(in6->sin6_port));
  }
  auto* in = reinterpret_cast<sockaddr_in*>(&address);
  inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(in->sin_port));
}

}  // namespace

absl::StatusOr<MetricsAddress> ParseMetricsAddress(std::string_view text) {
  MetricsAddress address;
  if (text.starts_with("unix:")) {
    address.unix_path = std::string(text.substr(5));
    if (address.unix_path.empty()) return absl::InvalidArgumentError("unix: needs a path, e.g. unix:/run/tensord/metrics.sock");
    return address;
  }
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    return absl::InvalidArgumentError("expected HOST:PORT (e.g. 127.0.0.1:9464) or unix:PATH");
  }
  std::string_view host = text.substr(0, colon);
  if (host.starts_with('[') && host.ends_with(']')) {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return absl::InvalidArgumentError("an IPv6 address goes in brackets: [::1]:9464");
  }
  const std::string port_text(text.substr(colon + 1));
  uint32_t port = 0;
  if (port_text.empty() || port_text.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", common::QuoteForError(port_text), " is not a number from 0 to 65535"));
  }
  address.host = std::string(host);
  address.port = static_cast<uint16_t>(port);
  return address;
}

absl::StatusOr<std::string> MetricsEndpoint::Start(const MetricsAddress& address, mode_t mode, gid_t group,
                                                   Render render) {
  render_ = std::move(render);
  std::string where;
  if (!address.unix_path.empty()) {
    TENSORD_ASSIGN_OR_RETURN(socket_, ListenUnix(address.unix_path, SOCK_STREAM, mode, group));
    where = absl::StrCat("unix:", address.unix_path);
  } else {
    TENSORD_ASSIGN_OR_RETURN(socket_, ListenTcp(address));
    where = BoundAddress(socket_.fd.get());
  }
  wake_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) {
    socket_.Close();
    return common::ErrnoToStatus("metrics endpoint eventfd", errno);
  }
  thread_ = std::thread([this] { Run(); });
  return where;
}

void MetricsEndpoint::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  if (write(wake_fd_.get(), &one, sizeof(one)) < 0) {
    spdlog::warn("metrics endpoint: cannot wake its thread: {}", std::strerror(errno));
  }
  thread_.join();
  socket_.Close();
}

void MetricsEndpoint::Run() {
  std::vector<Connection> connections;
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({socket_.fd.get(), POLLIN, 0});
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    Clock::time_point next_deadline = Clock::time_point::max();
    for (const Connection& connection : connections) {
      fds.push_back({connection.fd.get(), static_cast<short>(connection.answering ? POLLOUT : POLLIN), 0});
      next_deadline = std::min(next_deadline, connection.deadline);
    }
    const int timeout = connections.empty() ? -1 : std::max(1, MillisLeft(next_deadline));
    if (poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("metrics endpoint: poll: {}; it stops serving", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& connection = connections[i];
      if (fds[i + 2].revents != 0) Progress(connection, now);
      if (!connection.done && now >= connection.deadline) connection.done = true;  // too slow: dropped
    }
    std::erase_if(connections, [](const Connection& connection) { return connection.done; });
    if (fds[0].revents != 0) Accept(connections, now);
  }
}

void MetricsEndpoint::Accept(std::vector<Connection>& connections, Clock::time_point now) {
  while (true) {
    common::UniqueFd fd(accept4(socket_.fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) {
      if (errno == EMFILE || errno == ENFILE) {
        // Out of fds: wait a little instead of spinning on the pending connection.
        pollfd wake{wake_fd_.get(), POLLIN, 0};
        poll(&wake, 1, 100);
      }
      return;
    }
    if (connections.size() >= kMaxConnections) {
      // Full: the connection that has waited longest goes. A scraper sends its request at
      // once and is answered at once, so only idle or half-open connections are dropped.
      auto oldest = std::min_element(connections.begin(), connections.end(),
                                     [](const Connection& a, const Connection& b) { return a.deadline < b.deadline; });
      connections.erase(oldest);
    }
    Connection& connection = connections.emplace_back();
    connection.fd = std::move(fd);
    connection.deadline = now + kRequestTimeout;
  }
}

void MetricsEndpoint::Progress(Connection& connection, Clock::time_point now) {
  const int fd = connection.fd.get();
  if (!connection.answering) {
    char buffer[2048];
    ssize_t n = recv(fd, buffer, std::min(sizeof(buffer), kMaxRequestBytes - connection.request.size()), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      connection.done = true;
      return;
    }
    connection.request.append(buffer, static_cast<size_t>(n));
    const bool whole = connection.request.find("\r\n\r\n") != std::string::npos ||
                       connection.request.find("\n\n") != std::string::npos;
    if (!whole && connection.request.size() < kMaxRequestBytes) return;
    connection.answer = whole ? Answer(connection.request)
                              : Response("431 Request Header Fields Too Large", "text/plain", "request too large\n");
    connection.answering = true;
    connection.deadline = now + kRequestTimeout;  // as long again to read the answer
  }
  while (connection.sent < connection.answer.size()) {
    ssize_t n = send(fd, connection.answer.data() + connection.sent, connection.answer.size() - connection.sent,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) break;
    connection.sent += static_cast<size_t>(n);
  }
  connection.done = true;  // answered (or the peer went): close
}

std::string MetricsEndpoint::Answer(const std::string& request) const {
  const std::string_view line(request.data(), request.find_first_of("\r\n"));
  const size_t first_space = line.find(' ');
  const size_t second_space = line.find(' ', first_space == std::string_view::npos ? line.size() : first_space + 1);
  if (first_space == std::string_view::npos || second_space == std::string_view::npos) {
    return Response("400 Bad Request", "text/plain", "expected: GET /metrics HTTP/1.1\n");
  }
  const std::string_view method = line.substr(0, first_space);
  std::string_view target = line.substr(first_space + 1, second_space - first_space - 1);
  target = target.substr(0, target.find('?'));
  if (method != "GET" && method != "HEAD") return Response("405 Method Not Allowed", "text/plain", "only GET /metrics\n");
  if (target != "/metrics") return Response("404 Not Found", "text/plain", "tensord serves its metrics at /metrics\n");
  std::string answer = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_());
  if (method == "HEAD") answer.resize(answer.find("\r\n\r\n") + 4);
  return answer;
}

}  // namespace tensord::server
