#include "server/cluster/device_stager.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/memory/host/memfd.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "tensord/cluster/v1/staging.pb.h"

extern char** environ;

namespace tensord::server::cluster {

namespace cv1 = tensord::cluster::v1;

namespace {

// The fd the helper finds its end of the socketpair at (its argv says so too).
constexpr int kHelperFd = 3;

std::string HowItEnded(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "ended";
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostCopy>> HostCopy::Make(uint64_t nbytes, const std::string& what) {
  TENSORD_ASSIGN_OR_RETURN(common::UniqueFd fd, common::CreateSealedMemfd(absl::StrCat("tensord-stage ", what), nbytes));
  TENSORD_ASSIGN_OR_RETURN(common::MappedRegion mapping,
                           common::MappedRegion::Map(fd.get(), nbytes, common::MapMode::kSharedWritable,
                                                     absl::StrCat(what, " (host copy)")));
  return std::unique_ptr<HostCopy>(new HostCopy(std::move(fd), std::move(mapping)));
}

DeviceStager::DeviceStager(std::string helper_path, absl::Duration timeout)
    : helper_path_(std::move(helper_path)), timeout_(timeout) {}

DeviceStager::~DeviceStager() {
  absl::MutexLock lock(&mu_);
  if (pid_ != 0) (void)StopLocked(/*kill=*/false);
}

pid_t DeviceStager::helper_pid() const {
  absl::MutexLock lock(&mu_);
  return pid_;
}

absl::Status DeviceStager::ToHost(const DeviceBuffer& buffer, uint64_t offset, uint64_t nbytes,
                                  const std::string& ready_fence, int host_fd, const std::string& what) {
  cv1::StageRequest request;
  request.set_direction(cv1::StageRequest::TO_HOST);
  request.set_offset(offset);
  request.set_nbytes(nbytes);
  request.set_ready_fence(ready_fence);
  request.set_what(what);
  return Call(request, buffer, host_fd);
}

absl::Status DeviceStager::ToDevice(const DeviceBuffer& buffer, uint64_t offset, uint64_t nbytes, int host_fd,
                                    const std::string& what) {
  cv1::StageRequest request;
  request.set_direction(cv1::StageRequest::TO_DEVICE);
  request.set_offset(offset);
  request.set_nbytes(nbytes);
  request.set_what(what);
  return Call(request, buffer, host_fd);
}

absl::Status DeviceStager::Call(cv1::StageRequest& request, const DeviceBuffer& buffer, int host_fd) {
  request.set_device_type(buffer.device_type);
  request.set_buffer_size(buffer.size);
  request.set_handle(buffer.handle->data);
  request.set_handle_fds(static_cast<uint32_t>(buffer.handle->fds.size()));
  std::vector<int> fds{host_fd};
  for (const common::UniqueFd& fd : buffer.handle->fds) fds.push_back(fd.get());

  absl::MutexLock lock(&mu_);
  TENSORD_RETURN_IF_ERROR(StartLocked());
  const std::string what = request.what();
  absl::StatusOr<common::FdIo> sent = common::SendFdMessage(socket_.get(), request, fds);
  if (!sent.ok()) {
    return absl::UnavailableError(absl::StrCat("stage ", what, ": the staging helper ", StopLocked(/*kill=*/true),
                                               " (", sent.status().message(), ")"));
  }
  pollfd ready{.fd = socket_.get(), .events = POLLIN, .revents = 0};
  int polled;
  do {
    polled = ::poll(&ready, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout_)));
  } while (polled < 0 && errno == EINTR);
  if (polled == 0) {
    return absl::UnavailableError(absl::StrCat("stage ", what, ": the staging helper did not answer in ",
                                               absl::FormatDuration(timeout_), "; it ", StopLocked(/*kill=*/true)));
  }
  absl::StatusOr<common::ReceivedMessage> received = common::ReceiveFdMessage(socket_.get(), 0);
  cv1::StageReply reply;
  if (!received.ok() || !common::ParseFdMessage(*received, &reply).ok()) {
    return absl::UnavailableError(
        absl::StrCat("stage ", what, ": the staging helper ", StopLocked(/*kill=*/true), " before it answered"));
  }
  if (reply.code() != 0) return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message());
  copies_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status DeviceStager::StartLocked() {
  if (pid_ != 0) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return absl::OkStatus();
    // It ended between copies (killed, or it failed): this copy starts a new one.
    spdlog::warn("cluster: the staging helper (pid {}) {}; starting another", pid_, HowItEnded(status));
    socket_ = common::UniqueFd();
    pid_ = 0;
  }
  if (helper_path_.empty()) {
    return absl::FailedPreconditionError(
        "no staging helper (tensord-stage) is set: device tensors cannot cross nodes here");
  }
  if (::access(helper_path_.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the staging helper ", helper_path_, " cannot be run (", ::strerror(errno),
                     "): device tensors cross nodes only through it; install it beside tensord"));
  }
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return common::ErrnoToStatus("socketpair for the staging helper", errno);
  }
  common::UniqueFd ours(pair[0]);
  common::UniqueFd theirs(pair[1]);
  if (theirs.get() == kHelperFd) {  // dup2 onto itself would keep FD_CLOEXEC
    theirs = common::UniqueFd(::fcntl(pair[1], F_DUPFD_CLOEXEC, kHelperFd + 1));
    if (!theirs.valid()) return common::ErrnoToStatus("dup for the staging helper", errno);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, theirs.get(), kHelperFd);
  // Nothing else of the daemon's: the sockets systemd passed it are not close-on-exec.
  posix_spawn_file_actions_addclosefrom_np(&actions, kHelperFd + 1);
  const std::string fd_arg = absl::StrCat(kHelperFd);
  char* argv[] = {const_cast<char*>(helper_path_.c_str()), const_cast<char*>(fd_arg.c_str()), nullptr};
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, helper_path_.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return common::ErrnoToStatus(absl::StrCat("start the staging helper ", helper_path_), spawned);
  socket_ = std::move(ours);
  pid_ = pid;
  spdlog::info("cluster: started the staging helper {} (pid {})", helper_path_, pid);
  return absl::OkStatus();
}

std::string DeviceStager::StopLocked(bool kill) {
  socket_ = common::UniqueFd();  // the helper reads end-of-file and exits
  if (kill) ::kill(pid_, SIGKILL);
  int status = 0;
  pid_t reaped;
  // A helper mid-copy finishes it first: give it a while, then kill it.
  for (int tries = 0; (reaped = ::waitpid(pid_, &status, WNOHANG)) == 0 && tries < 500; ++tries) ::usleep(10'000);
  if (reaped == 0) {
    ::kill(pid_, SIGKILL);
    reaped = ::waitpid(pid_, &status, 0);
  }
  std::string ended = reaped == pid_ ? HowItEnded(status) : "could not be reaped";
  spdlog::info("cluster: the staging helper (pid {}) {}", pid_, ended);
  pid_ = 0;
  return ended;
}

}  // namespace tensord::server::cluster
