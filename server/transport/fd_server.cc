#include "server/transport/fd_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include <cerrno>
#include <cstring>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/transport/unix_socket.h"
#include "spdlog/spdlog.h"
#include "tensord/v1/fd_channel.pb.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

constexpr size_t kMaxRequestFds = 1;

struct Connection {
  common::UniqueFd fd;
  common::PeerCredentials creds;
  uint64_t session_id = 0;  // 0 until HELLO
  uint64_t serial = 0;      // tells a reused fd number from the connection a deadline was for
};

using SteadyClock = std::chrono::steady_clock;

// Milliseconds until `deadline` for epoll_wait: -1 when there is none, at least 0.
int MillisUntil(std::optional<SteadyClock::time_point> deadline) {
  if (!deadline) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

// Sends a reply without blocking. False when the peer cannot take it (then it is dropped,
// and the caller closes the connection).
bool Reply(const Connection& connection, const v1::FdResponse& response,
           std::span<const int> fds = {}) {
  absl::StatusOr<common::FdIo> sent = common::SendFdMessage(connection.fd.get(), response, fds);
  if (!sent.ok()) {
    spdlog::debug("fd channel: reply to pid {} failed: {}", connection.creds.pid, sent.status().ToString());
    return false;
  }
  if (*sent == common::FdIo::kWouldBlock) {
    // Waiting for room would let one peer stall every other connection of the loop.
    spdlog::debug("fd channel: pid {} does not read its replies (its socket buffer is full)",
                  connection.creds.pid);
    return false;
  }
  return true;
}

bool ReplyError(const Connection& connection, uint64_t seq, const absl::Status& status) {
  v1::FdResponse response;
  response.set_seq(seq);
  response.mutable_error()->set_code(static_cast<int>(status.code()));
  response.mutable_error()->set_message(std::string(status.message()));
  return Reply(connection, response);
}

// Handles one datagram. False: close the connection.
bool Handle(Broker* broker, const FdServer::HelloCheck& hello_check, Connection& connection,
            common::ReceivedMessage received) {
  v1::FdRequest request;
  if (absl::Status parsed = common::ParseFdMessage(received, &request); !parsed.ok()) {
    ReplyError(connection, 0, parsed);
    return false;
  }
  bool wants_fd = request.body_case() == v1::FdRequest::kStage;
  if (received.fds.size() != (wants_fd ? 1u : 0u)) {
    // Unexpected fds are closed with `received` and the message refused.
    ReplyError(connection, request.seq(),
               absl::InvalidArgumentError(absl::StrCat("fd channel: ", received.fds.size(),
                                                       " fds attached; expected ", wants_fd ? 1 : 0)));
    return false;
  }
  if (connection.session_id == 0 && request.body_case() != v1::FdRequest::kHello) {
    ReplyError(connection, request.seq(),
               absl::FailedPreconditionError("fd channel: the first message must be HELLO"));
    return false;
  }
  switch (request.body_case()) {
    case v1::FdRequest::kHello: {
      if (connection.session_id != 0) {
        ReplyError(connection, request.seq(), absl::FailedPreconditionError("fd channel: HELLO sent twice"));
        return false;
      }
      if (request.hello().protocol_version() != common::kFdProtocolVersion) {
        ReplyError(connection, request.seq(),
                   absl::FailedPreconditionError(absl::StrCat(
                       "fd channel: protocol version ", request.hello().protocol_version(),
                       " is not supported; this tensord speaks ", common::kFdProtocolVersion)));
        return false;
      }
      if (hello_check) {
        if (absl::Status room = hello_check(connection.creds.uid); !room.ok()) {
          ReplyError(connection, request.seq(), room);
          return false;
        }
      }
      absl::StatusOr<v1::Welcome> welcome =
          broker->OpenSession(connection.creds, request.hello().client_name());
      if (!welcome.ok()) {
        ReplyError(connection, request.seq(), welcome.status());
        return false;
      }
      connection.session_id = welcome->session_id();
      v1::FdResponse response;
      response.set_seq(request.seq());
      *response.mutable_welcome() = std::move(*welcome);
      return Reply(connection, response);
    }
    case v1::FdRequest::kFetch: {
      absl::StatusOr<std::vector<Broker::FetchedHandle>> fetched =
          broker->FetchHandles(connection.session_id, request.fetch());
      if (!fetched.ok()) return ReplyError(connection, request.seq(), fetched.status());
      v1::FdResponse response;
      response.set_seq(request.seq());
      std::vector<int> fds;
      for (const Broker::FetchedHandle& entry : *fetched) {
        v1::FetchedBuffer* buffer = response.mutable_fetched()->add_buffers();
        buffer->set_buffer_id(entry.buffer_id);
        buffer->set_size(entry.size);
        buffer->set_device_type(entry.device_type);
        buffer->mutable_handle()->set_data(entry.handle.data);
        buffer->mutable_handle()->set_fd_count(static_cast<uint32_t>(entry.handle.fds.size()));
        for (const common::UniqueFd& fd : entry.handle.fds) fds.push_back(fd.get());
      }
      return Reply(connection, response, fds);  // our dups close with `fetched`
    }
    case v1::FdRequest::kStage: {
      absl::StatusOr<v1::Staged> staged =
          broker->StageFd(connection.session_id, std::move(received.fds[0]));
      if (!staged.ok()) return ReplyError(connection, request.seq(), staged.status());
      v1::FdResponse response;
      response.set_seq(request.seq());
      *response.mutable_staged() = *staged;
      return Reply(connection, response);
    }
    case v1::FdRequest::BODY_NOT_SET:
      ReplyError(connection, request.seq(), absl::InvalidArgumentError("fd channel: empty request"));
      return false;
  }
  return false;
}

}  // namespace

absl::Status FdServer::Start(ListeningSocket socket) {
  socket_ = std::move(socket);
  const std::string path = socket_.path;
  // Without its loop the socket serves nobody: it goes again, so clients are told at once.
  auto abandon = [&](absl::Status status) {
    socket_.Close();
    return status;
  };
  epoll_fd_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_) return abandon(common::ErrnoToStatus(absl::StrCat("fd channel ", path, ": epoll_create1"), errno));
  wake_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) return abandon(common::ErrnoToStatus(absl::StrCat("fd channel ", path, ": eventfd"), errno));
  const std::pair<int, const char*> watched[] = {{socket_.fd.get(), "listening socket"},
                                                 {wake_fd_.get(), "wake-up eventfd"}};
  for (const auto& [fd, what] : watched) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      return abandon(common::ErrnoToStatus(absl::StrCat("fd channel ", path, ": epoll_ctl(ADD) of its ", what), errno));
    }
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

absl::Status FdServer::PauseAccepting() {
  if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, socket_.fd.get(), nullptr) != 0) {
    return common::ErrnoToStatus("fd channel: stop accepting (epoll_ctl DEL)", errno);
  }
  return absl::OkStatus();
}

absl::Status FdServer::ResumeAccepting() {
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = socket_.fd.get();
  if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, socket_.fd.get(), &event) != 0) {
    return common::ErrnoToStatus("fd channel: accept again (epoll_ctl ADD)", errno);
  }
  return absl::OkStatus();
}

void FdServer::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  if (write(wake_fd_.get(), &one, sizeof(one)) < 0) {
    spdlog::warn("fd channel: cannot wake the loop: {}", std::strerror(errno));
  }
  thread_.join();
  socket_.Close();
}

void FdServer::Run() {
  absl::flat_hash_map<int, Connection> connections;
  ConnectionLimits limits("fd channel", caps_);
  // Connections before HELLO, oldest first (one timeout for all keeps deadlines in order).
  struct HelloDeadline {
    SteadyClock::time_point at;
    int fd;
    uint64_t serial;
  };
  std::deque<HelloDeadline> hello_deadlines;
  uint64_t last_serial = 0;
  auto close_connection = [&](int fd) {
    auto it = connections.find(fd);
    if (it == connections.end()) return;
    // Closing the socket below drops it from the epoll set as well (no one else holds it);
    // a failure here means our bookkeeping and the kernel's disagree.
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr) != 0) {
      const int err = errno;
      spdlog::warn("fd channel: epoll_ctl(DEL) of the connection of pid {}: {}", it->second.creds.pid,
                   std::strerror(err));
    }
    uint64_t session = it->second.session_id;
    limits.Leave(it->second.creds.uid);
    connections.erase(it);  // closes the socket
    if (session != 0) broker_->CloseSession(session);
  };
  auto expire_hellos = [&] {
    const SteadyClock::time_point now = SteadyClock::now();
    while (!hello_deadlines.empty() && hello_deadlines.front().at <= now) {
      HelloDeadline due = hello_deadlines.front();
      hello_deadlines.pop_front();
      auto it = connections.find(due.fd);
      if (it == connections.end() || it->second.serial != due.serial || it->second.session_id != 0) continue;
      ReplyError(it->second, 0, absl::DeadlineExceededError(absl::StrCat(
          "fd channel: no HELLO within ", hello_timeout_.count(), " ms of connecting")));
      spdlog::debug("fd channel: pid {} uid {} sent no HELLO in time; closed", it->second.creds.pid,
                    it->second.creds.uid);
      close_connection(due.fd);
    }
  };
  Acceptor acceptor;
  epoll_event events[64];
  bool running = true;
  while (running) {
    std::optional<SteadyClock::time_point> next_deadline;
    if (!hello_deadlines.empty()) next_deadline = hello_deadlines.front().at;
    int n = epoll_wait(epoll_fd_.get(), events, 64, MillisUntil(next_deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("fd channel: epoll_wait: {}", std::strerror(errno));
      break;
    }
    expire_hellos();
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_fd_.get()) {
        running = false;
      } else if (fd == socket_.fd.get()) {
        while (true) {
          bool shed = false;
          common::UniqueFd client = acceptor.Accept(socket_.fd.get(), &shed);
          if (!client) {
            if (shed) continue;
            break;
          }
          Connection connection;
          connection.fd = std::move(client);
          absl::StatusOr<common::PeerCredentials> creds = common::GetPeerCredentials(connection.fd.get());
          if (!creds.ok()) {
            spdlog::warn("fd channel: {}", creds.status().ToString());
            continue;
          }
          connection.creds = *creds;
          if (absl::Status admitted = limits.Admit(creds->uid); !admitted.ok()) {
            ReplyError(connection, 0, admitted);
            spdlog::debug("fd channel: pid {} refused: {}", creds->pid, std::string(admitted.message()));
            continue;  // closed here
          }
          int client_fd = connection.fd.get();
          epoll_event event{};
          event.events = EPOLLIN | EPOLLRDHUP;
          event.data.fd = client_fd;
          if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, client_fd, &event) != 0) {
            // Unwatched, the connection would never be served: refuse it now (the kernel's
            // limit on epoll watches, or memory, is what ran out).
            const int err = errno;
            spdlog::warn("fd channel: epoll_ctl(ADD) of the connection of pid {} uid {}: {}; closed",
                         creds->pid, creds->uid, std::strerror(err));
            ReplyError(connection, 0, absl::UnavailableError("fd channel: the broker cannot serve another connection now"));
            limits.Leave(creds->uid);
            continue;  // closed here
          }
          connection.serial = ++last_serial;
          hello_deadlines.push_back({SteadyClock::now() + hello_timeout_, client_fd, connection.serial});
          connections.emplace(client_fd, std::move(connection));
        }
      } else {
        auto it = connections.find(fd);
        if (it == connections.end()) continue;
        bool keep = true;
        if (events[i].events & EPOLLIN) {
          // Room for the one fd a STAGE carries: the kernel drops a larger batch's surplus
          // (MSG_CTRUNC), so a peer cannot make us hold hundreds of its fds.
          absl::StatusOr<common::ReceivedMessage> received = common::ReceiveFdMessage(fd, kMaxRequestFds);
          if (!received.ok()) {
            // A peer that hung up (UNAVAILABLE) cannot be told; any other is told why.
            if (received.status().code() != absl::StatusCode::kUnavailable) {
              ReplyError(it->second, 0, received.status());
            }
            keep = false;
          } else if (received->io == common::FdIo::kWouldBlock) {
            keep = true;  // woken with nothing queued after all
          } else {
            keep = Handle(broker_, hello_check_, it->second, std::move(*received));
          }
        } else if (events[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) {
          keep = false;
        }
        if (!keep) close_connection(fd);
      }
    }
  }
  std::vector<int> open;
  for (const auto& [fd, connection] : connections) open.push_back(fd);
  for (int fd : open) close_connection(fd);
}

}  // namespace tensord::server
