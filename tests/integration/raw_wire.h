// Speaking tensord's wire protocol by hand, for tests that must send what no client would:
// raw fd-channel datagrams (with any fds attached), HELLO sessions without the client
// library, and a look at the daemon process from outside (/proc). Links the generated code
// and tensord_common, never libtensord.so.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "grpcpp/support/status.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "tests/integration/proc_info.h"
#include "tensord/v1/broker.pb.h"
#include "tensord/v1/fd_channel.pb.h"

namespace tensord::testing {

namespace v1 = tensord::v1;
using namespace std::chrono_literals;

inline constexpr char kTokenKey[] = "tensord-session";
inline constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// ---------------------------------------------------------------------------------------
// What the daemon process looks like from outside.

inline bool Alive(pid_t pid) { return pid > 0 && kill(pid, 0) == 0; }

// ---------------------------------------------------------------------------------------
// The fd channel, spoken by hand.

inline bool SendRaw(int socket, std::string_view bytes, std::span<const int> fds = {}) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<uint64_t> control((CMSG_SPACE(fds.size() * sizeof(int)) + 7) / 8);
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  return sendmsg(socket, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

inline std::string Bytes(const v1::FdRequest& request) { return request.SerializeAsString(); }

inline v1::FdRequest HelloRequest(uint32_t version = common::kFdProtocolVersion) {
  v1::FdRequest request;
  request.set_seq(1);
  request.mutable_hello()->set_protocol_version(version);
  request.mutable_hello()->set_client_name("hostile");
  return request;
}

struct FdReply {
  enum Kind { kMessage, kClosed, kSilent, kUnparsable } kind = kSilent;
  v1::FdResponse response;
  std::vector<common::UniqueFd> fds;
};

inline FdReply Receive(int socket, std::chrono::milliseconds timeout = 5s) {
  FdReply reply;
  pollfd pfd{socket, POLLIN, 0};
  if (poll(&pfd, 1, static_cast<int>(timeout.count())) <= 0) return reply;
  std::string bytes(common::kMaxFdMessageBytes, '\0');
  iovec iov{bytes.data(), bytes.size()};
  std::vector<uint64_t> control(CMSG_SPACE(16 * sizeof(int)) / 8 + 1);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = CMSG_SPACE(16 * sizeof(int));
  ssize_t n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      reply.fds.emplace_back(fd);
    }
  }
  if (n <= 0) {
    reply.kind = FdReply::kClosed;  // EOF or ECONNRESET
    return reply;
  }
  bytes.resize(static_cast<size_t>(n));
  reply.kind = reply.response.ParseFromString(bytes) ? FdReply::kMessage : FdReply::kUnparsable;
  return reply;
}

// The daemon answers `code` mentioning `text`, then closes the connection.
inline void ExpectErrorThenClose(int socket, grpc::StatusCode code, std::string_view text, const std::string& what) {
  FdReply reply = Receive(socket);
  ASSERT_EQ(reply.kind, FdReply::kMessage) << what << ": no error reply";
  ASSERT_TRUE(reply.response.has_error()) << what << ": " << reply.response.ShortDebugString();
  EXPECT_EQ(reply.response.error().code(), code) << what << ": " << reply.response.error().message();
  EXPECT_NE(reply.response.error().message().find(text), std::string::npos)
      << what << ": " << reply.response.error().message();
  EXPECT_TRUE(reply.fds.empty()) << what;
  EXPECT_EQ(Receive(socket).kind, FdReply::kClosed) << what << ": the daemon kept the connection";
}

struct RawSession {
  common::UniqueFd fd;
  v1::Welcome welcome;
  const std::string& token() const { return welcome.session_token(); }
};

inline common::UniqueFd ConnectFdChannel(const std::string& socket) {
  auto fd = common::ConnectSeqpacket(socket + ".fd");
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? std::move(*fd) : common::UniqueFd();
}

inline RawSession OpenSession(const std::string& socket) {
  RawSession session;
  session.fd = ConnectFdChannel(socket);
  EXPECT_TRUE(SendRaw(session.fd.get(), Bytes(HelloRequest())));
  FdReply reply = Receive(session.fd.get());
  EXPECT_EQ(reply.kind, FdReply::kMessage);
  EXPECT_TRUE(reply.response.has_welcome()) << reply.response.ShortDebugString();
  session.welcome = reply.response.welcome();
  return session;
}

inline std::string CodeName(grpc::StatusCode code) {
  static const char* names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  int i = static_cast<int>(code);
  return i >= 0 && i <= 16 ? names[i] : std::to_string(i);
}

inline v1::TensorDesc Float32(std::vector<int64_t> shape) {
  v1::TensorDesc desc;
  desc.mutable_dtype()->set_code(v1::DTYPE_CODE_FLOAT);
  desc.mutable_dtype()->set_bits(32);
  desc.mutable_dtype()->set_lanes(1);
  for (int64_t dim : shape) desc.add_shape(dim);
  desc.mutable_device()->set_type(v1::DEVICE_TYPE_CPU);
  return desc;
}

// Reads a Session stream one reply (or push) at a time: the broker sends replies that are
// ready together as one SessionResponse.batch, which this unpacks.
class SessionReplies {
 public:
  using Stream = grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>;
  explicit SessionReplies(Stream* stream) : stream_(stream) {}
  // False once the stream has ended and every reply has been handed out.
  bool Next(v1::SessionResponse* reply) {
    while (unpacked_.empty()) {
      v1::SessionResponse message;
      if (!stream_->Read(&message)) return false;
      ++messages_;
      if (!message.has_batch()) {
        unpacked_.push_back(std::move(message));
        continue;
      }
      for (v1::SessionResponse& inner : *message.mutable_batch()->mutable_responses()) {
        unpacked_.push_back(std::move(inner));
      }
    }
    *reply = std::move(unpacked_.front());
    unpacked_.pop_front();
    return true;
  }
  // Stream messages read so far (a batch counts once).
  int messages() const { return messages_; }

 private:
  Stream* stream_;
  std::deque<v1::SessionResponse> unpacked_;
  int messages_ = 0;
};

}  // namespace tensord::testing
