// One datagram with at most one fd over a socketpair: how the GPU-fake tests and their
// peer process hand each other a handle's bytes and its fd (the fd channel's protobuf
// framing, common/fd_channel.h, is more than these tests need).
#pragma once

#include <sys/socket.h>

#include <cstring>
#include <string>

namespace tensord::common::testing {

// Sends `bytes` with `fd` attached (none when -1); true when all of it went.
inline bool SendWithFd(int sock, const std::string& bytes, int fd = -1) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return ::sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Receives one datagram and at most one fd (-1 when none came); false on end of file, an
// error or a truncated message.
inline bool ReceiveWithFd(int sock, std::string* bytes, int* fd) {
  char buf[4096];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) return false;
  *fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(fd, CMSG_DATA(c), sizeof(int));
  }
  bytes->assign(buf, static_cast<size_t>(n));
  return true;
}

}  // namespace tensord::common::testing
