#include "common/fd_channel.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensord/v1/fd_channel.pb.h"
#include "tests/unit/common/status_matchers.h"

namespace tensord::common {
namespace {

using ::tensord::common::testing::IsOk;
using ::tensord::common::testing::IsOkAndHolds;
using ::tensord::common::testing::StatusIs;
using ::testing::HasSubstr;

int CountOpenFds() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory's own fd
}

class FdChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    a_.reset(sv[0]);
    b_.reset(sv[1]);
  }

  static v1::FdRequest Hello() {
    v1::FdRequest request;
    request.set_seq(42);
    request.mutable_hello()->set_protocol_version(kFdProtocolVersion);
    request.mutable_hello()->set_client_name("test");
    return request;
  }

  static UniqueFd Memfd(const char* name) {
    UniqueFd fd(memfd_create(name, MFD_CLOEXEC));
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(ftruncate(fd.get(), 4096), 0);
    return fd;
  }

  UniqueFd a_, b_;
};

TEST_F(FdChannelTest, MessageWithoutFds) {
  ASSERT_THAT(SendFdMessage(a_.get(), Hello()), IsOk());
  auto received = ReceiveFdMessage(b_.get(), 4);
  ASSERT_THAT(received, IsOk());
  EXPECT_TRUE(received->fds.empty());
  v1::FdRequest parsed;
  ASSERT_THAT(ParseFdMessage(*received, &parsed), IsOk());
  EXPECT_EQ(parsed.seq(), 42u);
  EXPECT_EQ(parsed.hello().client_name(), "test");
}

TEST_F(FdChannelTest, PassesThreeFdsOfTheSameMemfd) {
  UniqueFd memfd = Memfd("shared");
  UniqueFd dup1(dup(memfd.get()));
  UniqueFd dup2(dup(memfd.get()));
  int fds[] = {memfd.get(), dup1.get(), dup2.get()};
  ASSERT_THAT(SendFdMessage(a_.get(), Hello(), fds), IsOk());

  auto received = ReceiveFdMessage(b_.get(), 3);
  ASSERT_THAT(received, IsOk());
  ASSERT_EQ(received->fds.size(), 3u);
  struct stat original {};
  ASSERT_EQ(fstat(memfd.get(), &original), 0);
  for (const UniqueFd& fd : received->fds) {
    EXPECT_NE(fd.get(), memfd.get());
    struct stat st {};
    ASSERT_EQ(fstat(fd.get(), &st), 0);
    EXPECT_EQ(st.st_ino, original.st_ino);
    EXPECT_EQ(st.st_dev, original.st_dev);
    EXPECT_TRUE(fcntl(fd.get(), F_GETFD) & FD_CLOEXEC) << "MSG_CMSG_CLOEXEC not applied";
  }
  // And they share the memory itself.
  ASSERT_EQ(pwrite(memfd.get(), "hi", 2, 100), 2);
  char buf[2] = {};
  ASSERT_EQ(pread(received->fds[2].get(), buf, 2, 100), 2);
  EXPECT_EQ(std::string(buf, 2), "hi");
}

TEST_F(FdChannelTest, SendRefusesTooManyFds) {
  UniqueFd memfd = Memfd("many");
  std::vector<int> fds(kMaxFdsPerMessage + 1, memfd.get());
  EXPECT_THAT(SendFdMessage(a_.get(), Hello(), fds),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("254 fds")));
}

TEST_F(FdChannelTest, SendRefusesOversizedAndEmptyMessages) {
  v1::FdRequest big = Hello();
  big.mutable_hello()->set_client_name(std::string(kMaxFdMessageBytes, 'x'));
  EXPECT_THAT(SendFdMessage(a_.get(), big),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds")));
  EXPECT_THAT(SendFdMessage(a_.get(), v1::FdRequest()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
}

TEST_F(FdChannelTest, MoreFdsThanAllowedAreClosedAndRefused) {
  UniqueFd memfd = Memfd("surplus");
  int before = CountOpenFds();
  struct Case {
    size_t sent;
    size_t max_fds;
  };
  // (5, *): the control buffer is too small, the kernel sets MSG_CTRUNC after installing
  // the fds that fit. (2, 1): CMSG_SPACE rounds room for 1 fd up to 2, both arrive intact,
  // and the count check refuses them.
  for (Case c : {Case{5, 0}, Case{5, 1}, Case{5, 4}, Case{2, 1}}) {
    SCOPED_TRACE(::testing::Message() << c.sent << " fds, max " << c.max_fds);
    std::vector<int> fds(c.sent, memfd.get());
    ASSERT_THAT(SendFdMessage(a_.get(), Hello(), fds), IsOk());
    EXPECT_THAT(ReceiveFdMessage(b_.get(), c.max_fds),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fds")));
    EXPECT_EQ(CountOpenFds(), before) << "received fds leaked";
  }
  // The channel is still usable afterwards.
  std::vector<int> fds(5, memfd.get());
  ASSERT_THAT(SendFdMessage(a_.get(), Hello(), fds), IsOk());
  auto received = ReceiveFdMessage(b_.get(), 5);
  ASSERT_THAT(received, IsOk());
  EXPECT_EQ(received->fds.size(), 5u);
}

TEST_F(FdChannelTest, FullFdTableIsResourceExhausted) {
  UniqueFd memfd = Memfd("full");
  std::vector<int> fds(3, memfd.get());
  ASSERT_THAT(SendFdMessage(a_.get(), Hello(), fds), IsOk());
  int before = CountOpenFds();
  // Leave exactly one free fd number: the lowest free one.
  UniqueFd probe(dup(0));
  ASSERT_TRUE(probe.valid());
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(probe.get()) + 1;
  probe.reset();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  auto received = ReceiveFdMessage(b_.get(), 3);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_THAT(received, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("RLIMIT_NOFILE")));
  EXPECT_EQ(CountOpenFds(), before);
}

TEST_F(FdChannelTest, OversizedDatagramIsRefused) {
  std::string big(kMaxFdMessageBytes + 100, 'x');
  ASSERT_EQ(send(a_.get(), big.data(), big.size(), 0), static_cast<ssize_t>(big.size()));
  EXPECT_THAT(ReceiveFdMessage(b_.get(), 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("longer than")));
}

TEST_F(FdChannelTest, MalformedMessageIsNamed) {
  ASSERT_EQ(send(a_.get(), "\xff\xff\xff", 3, 0), 3);
  auto received = ReceiveFdMessage(b_.get(), 0);
  ASSERT_THAT(received, IsOk());
  v1::FdRequest request;
  EXPECT_THAT(ParseFdMessage(*received, &request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "fd channel: malformed tensord.v1.FdRequest"));
}

TEST_F(FdChannelTest, PeerClosedIsUnavailable) {
  a_.reset();
  EXPECT_THAT(ReceiveFdMessage(b_.get(), 1),
              StatusIs(absl::StatusCode::kUnavailable, "peer closed the fd channel"));
  EXPECT_THAT(SendFdMessage(b_.get(), Hello()),
              StatusIs(absl::StatusCode::kUnavailable, "peer closed the fd channel"));
}

TEST_F(FdChannelTest, NonBlockingReceiveWouldBlockAndHoldsNothingToParse) {
  ASSERT_EQ(fcntl(b_.get(), F_SETFL, O_NONBLOCK), 0);
  auto received = ReceiveFdMessage(b_.get(), 1);
  ASSERT_THAT(received, IsOk());
  EXPECT_EQ(received->io, FdIo::kWouldBlock);
  EXPECT_TRUE(received->bytes.empty());
  EXPECT_TRUE(received->fds.empty());
  v1::FdRequest request;
  EXPECT_THAT(ParseFdMessage(*received, &request),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("would have blocked")));

  // Once a message is queued, the same socket receives it.
  ASSERT_THAT(SendFdMessage(a_.get(), Hello()), IsOkAndHolds(FdIo::kDone));
  received = ReceiveFdMessage(b_.get(), 1);
  ASSERT_THAT(received, IsOk());
  EXPECT_EQ(received->io, FdIo::kDone);
  ASSERT_THAT(ParseFdMessage(*received, &request), IsOk());
  EXPECT_EQ(request.seq(), 42u);
}

TEST_F(FdChannelTest, NonBlockingSendWouldBlockWhenThePeerDoesNotRead) {
  ASSERT_EQ(fcntl(a_.get(), F_SETFL, O_NONBLOCK), 0);
  // The socket buffer fills after some hundreds of datagrams; a bound, not a hang.
  absl::StatusOr<FdIo> sent;
  int queued = 0;
  for (; queued < 100000; ++queued) {
    sent = SendFdMessage(a_.get(), Hello());
    ASSERT_THAT(sent, IsOk());
    if (*sent == FdIo::kWouldBlock) break;
  }
  ASSERT_EQ(*sent, FdIo::kWouldBlock) << "still room after " << queued << " messages";
  EXPECT_GT(queued, 0);
  // Reading one makes room for one more.
  ASSERT_THAT(ReceiveFdMessage(b_.get(), 0), IsOk());
  EXPECT_THAT(SendFdMessage(a_.get(), Hello()), IsOkAndHolds(FdIo::kDone));
}

TEST_F(FdChannelTest, PeerCredentialsAreOurs) {
  auto creds = GetPeerCredentials(b_.get());
  ASSERT_THAT(creds, IsOk());
  EXPECT_EQ(creds->uid, getuid());
  EXPECT_EQ(creds->gid, getgid());
  EXPECT_EQ(creds->pid, getpid());
}

TEST(ConnectSeqpacketTest, RefusesOverlongPath) {
  EXPECT_THAT(ConnectSeqpacket("/tmp/" + std::string(200, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes")));
  EXPECT_THAT(ConnectSeqpacket(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes")));
}

TEST(ConnectSeqpacketTest, NobodyListening) {
  std::string path = "/tmp/tensord-test-missing-" + std::to_string(getpid()) + ".sock";
  EXPECT_THAT(ConnectSeqpacket(path),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(path)));
}

TEST(ConnectSeqpacketTest, ConnectsToListener) {
  std::string path = "/tmp/tensord-test-" + std::to_string(getpid()) + ".sock";
  unlink(path.c_str());
  UniqueFd listener(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(listener.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener.get(), 4), 0);

  auto client = ConnectSeqpacket(path);
  ASSERT_THAT(client, IsOk());
  EXPECT_TRUE(fcntl(client->get(), F_GETFD) & FD_CLOEXEC);
  UniqueFd server(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(server.valid());
  v1::FdResponse response;
  response.set_seq(1);
  response.mutable_welcome()->set_session_id(9);
  ASSERT_THAT(SendFdMessage(server.get(), response), IsOk());
  auto received = ReceiveFdMessage(client->get(), 0);
  ASSERT_THAT(received, IsOk());
  v1::FdResponse parsed;
  ASSERT_THAT(ParseFdMessage(*received, &parsed), IsOk());
  EXPECT_EQ(parsed.welcome().session_id(), 9u);
  unlink(path.c_str());
}

}  // namespace
}  // namespace tensord::common
