// The fd channel's receive path (common/fd_channel.h) against a hostile peer: datagrams of
// any length (up to past kMaxFdMessageBytes), any number of attached fds in one or two
// SCM_RIGHTS headers, and any max_fds on our side; then the protobuf parse of what arrived,
// and a send/receive round trip of a message parsed from the input.
//
// Invariants: a datagram is accepted exactly when it fits, carries at most max_fds fds and
// is not the empty end-of-file datagram, and then arrives byte for byte with its fds, each
// close-on-exec; every refusal has the documented code; and whatever happens, no fd is
// left open (the process's fd count is the same before and after).
#include <dirent.h>
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/fd_channel.h"
#include "google/protobuf/stubs/logging.h"
#include "tensord/v1/fd_channel.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace tensord::common {
namespace {

int CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  FUZZ_CHECK(dir != nullptr) << std::strerror(errno);
  int count = 0;
  while (readdir(dir) != nullptr) ++count;
  closedir(dir);
  return count;
}

struct SocketPair {
  UniqueFd sender;
  UniqueFd receiver;
};

SocketPair MakePair() {
  int fds[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fds) == 0)
      << std::strerror(errno);
  return SocketPair{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Sends `bytes` with `fds` split over `headers` SCM_RIGHTS control messages, as a peer that
// does not use SendFdMessage might. False when the kernel refused it.
bool SendRaw(int socket, const std::string& bytes, const std::vector<int>& fds, int headers) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  size_t first = headers == 2 ? fds.size() / 2 : fds.size();
  size_t second = fds.size() - first;
  std::vector<uint64_t> control((CMSG_SPACE(first * sizeof(int)) + CMSG_SPACE(second * sizeof(int))) /
                                    sizeof(uint64_t) + 1);
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(first * sizeof(int)) + (second > 0 ? CMSG_SPACE(second * sizeof(int)) : 0);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(first * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), first * sizeof(int));
    if (second > 0) {
      c = CMSG_NXTHDR(&msg, c);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(second * sizeof(int));
      std::memcpy(CMSG_DATA(c), fds.data() + first, second * sizeof(int));
    }
  }
  return ::sendmsg(socket, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

void CheckRawReceive(FuzzedDataProvider& in, int memfd) {
  std::string bytes = in.ConsumeRandomLengthString(512);
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: bytes.resize(kMaxFdMessageBytes, 'x'); break;       // exactly the limit
    case 1: bytes.resize(kMaxFdMessageBytes + 1, 'x'); break;   // one past it
    case 2: bytes.clear(); break;                                // reads as end-of-file
    default: break;
  }
  size_t attach = in.ConsumeBool() ? in.ConsumeIntegralInRange<size_t>(0, 4)
                                   : in.ConsumeIntegralInRange<size_t>(0, kMaxFdsPerMessage);
  int headers = in.ConsumeBool() ? 2 : 1;
  size_t max_fds = in.ConsumeBool() ? in.ConsumeIntegralInRange<size_t>(0, 4)
                                    : in.ConsumeIntegralInRange<size_t>(0, kMaxFdsPerMessage + 8);

  SocketPair pair = MakePair();
  std::vector<UniqueFd> owned;
  std::vector<int> fds;
  for (size_t i = 0; i < attach; ++i) {
    owned.emplace_back(fcntl(memfd, F_DUPFD_CLOEXEC, 0));
    FUZZ_CHECK(owned.back().valid()) << std::strerror(errno);
    fds.push_back(owned.back().get());
  }
  if (!SendRaw(pair.sender.get(), bytes, fds, headers)) return;  // the kernel said no
  owned.clear();  // what was sent is in flight now, owned by the socket

  absl::StatusOr<ReceivedMessage> received = ReceiveFdMessage(pair.receiver.get(), max_fds);
  size_t effective_max = std::min(max_fds, kMaxFdsPerMessage);
  if (bytes.size() > kMaxFdMessageBytes) {
    FUZZ_CHECK(received.status().code() == absl::StatusCode::kInvalidArgument) << received.status();
  } else if (attach > effective_max) {
    FUZZ_CHECK(received.status().code() == absl::StatusCode::kInvalidArgument) << received.status();
  } else if (bytes.empty() && attach == 0) {
    FUZZ_CHECK(received.status().code() == absl::StatusCode::kUnavailable) << received.status();
  } else {
    FUZZ_CHECK(received.ok()) << received.status() << " for " << bytes.size() << " bytes, "
                              << attach << " fds, max_fds " << max_fds;
    FUZZ_CHECK(received->io == FdIo::kDone);  // sent before, so never would block
    FUZZ_CHECK(received->bytes == bytes);
    FUZZ_CHECK(received->fds.size() == attach);
    for (const UniqueFd& fd : received->fds) {
      FUZZ_CHECK((fcntl(fd.get(), F_GETFD) & FD_CLOEXEC) != 0) << "fd " << fd.get();
    }
    tensord::v1::FdRequest request;
    absl::Status parsed = ParseFdMessage(*received, &request);
    FUZZ_CHECK(parsed.ok() || parsed.code() == absl::StatusCode::kInvalidArgument) << parsed;
  }
  if (!received.ok()) {
    FUZZ_CHECK(fuzz::IsReadableMessage(received.status().message(), 256)) << received.status();
  }
}

// A message a peer could legitimately send: what SendFdMessage accepts arrives intact.
void CheckRoundTrip(FuzzedDataProvider& in, int memfd) {
  tensord::v1::FdResponse response;
  if (!response.ParseFromString(in.ConsumeRandomLengthString(1024))) return;
  size_t attach = in.ConsumeIntegralInRange<size_t>(0, 3);
  std::vector<int> fds(attach, memfd);
  SocketPair pair = MakePair();
  absl::StatusOr<FdIo> sent = SendFdMessage(pair.sender.get(), response, fds);
  if (response.ByteSizeLong() == 0) {
    FUZZ_CHECK(sent.status().code() == absl::StatusCode::kInvalidArgument) << sent.status();
    return;
  }
  FUZZ_CHECK(sent.ok() && *sent == FdIo::kDone) << sent.status();
  absl::StatusOr<ReceivedMessage> received = ReceiveFdMessage(pair.receiver.get(), attach);
  FUZZ_CHECK(received.ok() && received->io == FdIo::kDone) << received.status();
  FUZZ_CHECK(received->fds.size() == attach);
  tensord::v1::FdResponse back;
  FUZZ_CHECK(ParseFdMessage(*received, &back).ok());
  FUZZ_CHECK(back.SerializeAsString() == response.SerializeAsString());
}

}  // namespace
}  // namespace tensord::common

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Hostile bytes make protobuf log every invalid UTF-8 string it refuses: noise here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tensord::common::UniqueFd;
  FuzzedDataProvider in(data, size);
  static const int memfd = memfd_create("fuzz_fd_channel", MFD_CLOEXEC);  // what fds point at
  FUZZ_CHECK(memfd >= 0);
  int before = tensord::common::CountOpenFds();
  if (in.ConsumeBool()) {
    tensord::common::CheckRawReceive(in, memfd);
  } else {
    tensord::common::CheckRoundTrip(in, memfd);
  }
  int after = tensord::common::CountOpenFds();
  FUZZ_CHECK(before == after) << before << " fds open before, " << after << " after";
  return 0;
}
