#include "server/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

// Writes all of `data` before `deadline`; false when the peer is gone or too slow.
bool WriteAll(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, MillisLeft(deadline)) <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
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
  int last_errno = 0;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    common::UniqueFd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
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
  while (true) {
    pollfd fds[2] = {{socket_.fd.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("metrics endpoint: poll: {}; it stops serving", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    common::UniqueFd connection(accept4(socket_.fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!connection) {
      if (errno == EMFILE || errno == ENFILE) {
        // Out of fds: wait a little instead of spinning on the pending connection.
        poll(&fds[1], 1, 100);
      }
      continue;
    }
    Serve(std::move(connection));
  }
}

void MetricsEndpoint::Serve(common::UniqueFd connection) {
  const Clock::time_point deadline = Clock::now() + kRequestTimeout;
  std::string request;
  while (request.find("\r\n\r\n") == std::string::npos && request.find("\n\n") == std::string::npos) {
    if (request.size() >= kMaxRequestBytes) {
      WriteAll(connection.get(), Response("431 Request Header Fields Too Large", "text/plain", "request too large\n"),
               Clock::now() + kRequestTimeout);
      return;
    }
    pollfd p{connection.get(), POLLIN, 0};
    if (poll(&p, 1, MillisLeft(deadline)) <= 0) return;  // too slow: dropped
    char buffer[2048];
    ssize_t n = recv(connection.get(), buffer, std::min(sizeof(buffer), kMaxRequestBytes - request.size()), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  const std::string_view line(request.data(), request.find_first_of("\r\n"));
  const size_t first_space = line.find(' ');
  const size_t second_space = line.find(' ', first_space == std::string_view::npos ? line.size() : first_space + 1);
  std::string answer;
  if (first_space == std::string_view::npos || second_space == std::string_view::npos) {
    answer = Response("400 Bad Request", "text/plain", "expected: GET /metrics HTTP/1.1\n");
  } else {
    const std::string_view method = line.substr(0, first_space);
    std::string_view target = line.substr(first_space + 1, second_space - first_space - 1);
    target = target.substr(0, target.find('?'));
    if (method != "GET" && method != "HEAD") {
      answer = Response("405 Method Not Allowed", "text/plain", "only GET /metrics\n");
    } else if (target != "/metrics") {
      answer = Response("404 Not Found", "text/plain", "tensord serves its metrics at /metrics\n");
    } else {
      answer = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_());
      if (method == "HEAD") answer.resize(answer.find("\r\n\r\n") + 4);
    }
  }
  WriteAll(connection.get(), answer, Clock::now() + kRequestTimeout);
}

}  // namespace tensord::server
