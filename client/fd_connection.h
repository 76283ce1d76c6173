// FdConnection: the client's end of the fd channel (`<socket>.fd`, SOCK_SEQPACKET). The
// connection IS the session: the broker releases every lease of the session when it closes,
// which the kernel does the instant this process dies.
//
// Connect() opens the socket, checks the daemon's uid with SO_PEERCRED (the kernel's word,
// never the Welcome's): it must be root, our own uid, or one of `trusted_uids`, else
// PERMISSION_DENIED naming the uid; then HELLO -> WELCOME.
// Requests (FETCH_FD, STAGE) are serialized by a mutex: one request in flight, its reply
// matched by seq. A reply that does not come within `reply_timeout` gives DEADLINE_EXCEEDED
// and poisons the connection (a late reply would be mismatched). A closed peer gives
// UNAVAILABLE. Thread-safe.
//
// daemon() is the peer's SO_PEERCRED, which the gRPC connection's peer must match
// (grpc_connection.h); PeerClosed() tells without blocking whether the broker hung up.
//
// CloseInForkedChild() closes the inherited socket without taking any lock: it is called
// from a pthread_atfork child handler, where another (vanished) thread may hold the mutex.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include "absl/synchronization/mutex.h"
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/fd_channel.h"
#include "common/memory/importer.h"
#include "common/unique_fd.h"
#include "tensord/v1/fd_channel.pb.h"

namespace tensord::internal {

// OK when a daemon running as `daemon_uid` is acceptable to a client running as `our_uid`.
absl::Status CheckDaemonUid(uid_t daemon_uid, uid_t our_uid, std::span<const uint32_t> trusted_uids,
                            const std::string& path);

class FdConnection {
 public:
  static absl::StatusOr<std::unique_ptr<FdConnection>> Connect(
      const std::string& fd_path, const std::string& client_name,
      std::span<const uint32_t> trusted_uids,
      std::chrono::milliseconds reply_timeout = std::chrono::seconds(30));
  ~FdConnection() = default;
  FdConnection(const FdConnection&) = delete;
  FdConnection& operator=(const FdConnection&) = delete;

  const tensord::v1::Welcome& welcome() const { return welcome_; }
  const common::PeerCredentials& daemon() const { return daemon_; }
  // One poll(2): true once the broker has closed the connection (the session is over).
  bool PeerClosed() const;
  // The socket, for poll(POLLHUP) only; never read from it outside this class.
  int socket() const { return socket_.get(); }

  // One handle per buffer, in order; every buffer must be one the session holds a lease
  // on. Any number of buffers: a reply carries at most 253 fds, so this asks again for
  // whatever a reply left out.
  absl::StatusOr<std::vector<common::FetchedBuffer>> Fetch(std::span<const uint64_t> buffer_ids);
  // Stages `memfd` for Export; returns the staged id.
  absl::StatusOr<uint64_t> Stage(int memfd);

  void CloseInForkedChild();
  bool broken() const { return broken_.load(std::memory_order_acquire); }

 private:
  FdConnection(common::UniqueFd socket, std::chrono::milliseconds reply_timeout)
      : socket_(std::move(socket)), reply_timeout_(reply_timeout) {}
  // Sends `request` (seq filled in) with `fds` and waits for the reply with that seq.
  absl::StatusOr<tensord::v1::FdResponse> Call(tensord::v1::FdRequest request,
                                               std::span<const int> fds, size_t max_fds,
                                               std::vector<common::UniqueFd>* fds_out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Call's steps. Sends `request` (its seq `seq`) with `fds`; any failure but
  // INVALID_ARGUMENT (a message never sent) marks the connection broken.
  absl::Status SendRequest(const tensord::v1::FdRequest& request, std::span<const int> fds,
                           uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits up to reply_timeout_ for the reply to `seq` and receives it with room for
  // `max_fds`; any failure marks the connection broken.
  absl::StatusOr<common::ReceivedMessage> ReceiveReply(uint64_t seq, size_t max_fds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Parses `received` as the reply to `seq` (a bad or mismatched one marks the connection
  // broken): the broker's error as a status, else the reply with its fds moved to `fds_out`;
  // fds on an error reply, or where `fds_out` is null, refuse the reply.
  absl::StatusOr<tensord::v1::FdResponse> AcceptReply(common::ReceivedMessage& received, uint64_t seq,
                                                      std::vector<common::UniqueFd>* fds_out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the buffers of one FETCH_FD reply to `out`, each with its fds taken from `fds`,
  // once they are the ones `ask` named, in order, and name every fd the reply carries.
  static absl::Status TakeFetched(std::span<const uint64_t> ask, const tensord::v1::FdResponse& reply,
                                  std::vector<common::UniqueFd>& fds,
                                  std::vector<common::FetchedBuffer>& out);

  // Constant after construction (until CloseInForkedChild).
  common::UniqueFd socket_;
  const std::chrono::milliseconds reply_timeout_;
  tensord::v1::Welcome welcome_;
  common::PeerCredentials daemon_;

  std::atomic<bool> broken_{false};
  absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace tensord::internal
