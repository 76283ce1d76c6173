// RpcChannel: a session's gRPC side. It owns every gRPC object of the session: the gRPC
// connection (grpc_connection.h: made on first use, its peer checked to be the fd channel's
// daemon before the session token goes out, and made again when the broker closed it while
// the session lives), the Session stream (session_stream.h: opened on first use, reopened
// when it breaks), and the count of calls in flight; and it suspends them all around a
// fork(). What arrives on a stream unasked (pushes, replies whose caller gave up, failures
// of quiet requests) goes to the handlers it was made with, on the polling thread.
//
// It also keeps the session's life as calls see it: closing (its owner shut it down) and
// dead (the broker hung up: marked by the owner, or here when a new connection finds the fd
// channel closed). Calls are refused then, UNAVAILABLE.
//
// Thread-safe: one mutex, never held across a call, a connect or a stream's I/O. Lifetime:
// owned by its Session, after the fd channel it reads (the token, the daemon's credentials)
// and the handlers' targets; every Call and stream holder must be gone before it is (they
// hold the Session). Destroying it closes the stream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/fd_connection.h"
#include "client/grpc_connection.h"
#include "client/session_stream.h"
#include "grpcpp/client_context.h"
#include "tensord/client.h"
#include "tensord/v1/broker.grpc.pb.h"

namespace tensord::internal {

// "no tensord broker at <socket_path>: <cause> (is the daemon running?)": the message of the
// UNAVAILABLE a session reports when no broker answers.
std::string NoBrokerMessage(const std::string& socket_path, std::string_view cause);

class RpcChannel {
 public:
  // For what arrives on a stream unasked (see SessionStream::Open).
  struct Handlers {
    SessionStream::Handler on_push;
    SessionStream::Handler on_orphan;
    SessionStream::QuietFailureHandler on_quiet_failure;
  };
  static constexpr std::chrono::milliseconds kDefaultCallTimeout{30000};
  // How much longer than the broker's own acquire wait we wait for its answer.
  static constexpr std::chrono::milliseconds kWaitSlack{10000};
  // How long to wait for the answer to a call that waits `wait` at the broker.
  static std::optional<std::chrono::milliseconds> ReplyBound(Wait wait);

  // `fd` is the session's fd channel; `trusted_uids` as ClientOptions::trusted_daemon_uids.
  RpcChannel(std::string socket_path, const FdConnection& fd, std::vector<uint32_t> trusted_uids,
             Handlers handlers);
  ~RpcChannel();  // DropStream()
  RpcChannel(const RpcChannel&) = delete;
  RpcChannel& operator=(const RpcChannel&) = delete;

  // UNAVAILABLE once closing or dead.
  absl::Status CheckOpen() const;
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  void MarkDead() { dead_.store(true, std::memory_order_release); }
  bool closing() const { return closing_.load(std::memory_order_acquire); }
  void MarkClosing() { closing_.store(true); }

  // Makes the gRPC connection now, if there is none (Session::Open: its errors, a refused
  // peer above all, say what they are). Errors as BeginCall's.
  absl::Status Connect();

  // One Broker call: the stub (of the connection it keeps up) and a context with the session
  // metadata and an optional deadline. While it lives it counts as a call in flight, which
  // fork() preparation waits for; `cancel_on_fork` calls (long-lived streams) are cancelled by
  // it instead, and interrupted_by_fork() then tells them to open a new one.
  class Call {
   public:
    Call(Call&& other) noexcept
        : channel_(std::exchange(other.channel_, nullptr)),
          connection_(std::move(other.connection_)),
          context_(std::move(other.context_)),
          epoch_(other.epoch_) {}
    Call& operator=(Call&&) = delete;
    ~Call();
    tensord::v1::Broker::Stub* stub() const { return connection_->stub(); }
    grpc::ClientContext* context() const { return context_.get(); }
    bool interrupted_by_fork() const;

   private:
    friend class RpcChannel;
    Call(RpcChannel* channel, std::shared_ptr<GrpcConnection> connection,
         std::unique_ptr<grpc::ClientContext> context, uint64_t epoch)
        : channel_(channel),
          connection_(std::move(connection)),
          context_(std::move(context)),
          epoch_(epoch) {}
    RpcChannel* channel_;
    std::shared_ptr<GrpcConnection> connection_;
    std::unique_ptr<grpc::ClientContext> context_;
    uint64_t epoch_;
  };
  // Waits while a fork() is being prepared. `timeout` nullopt: no deadline. Makes the gRPC
  // connection when there is none or the broker closed it: PERMISSION_DENIED for a refused
  // peer, UNAVAILABLE naming the socket when no broker answers or the session is over.
  absl::StatusOr<Call> BeginCall(
      std::optional<std::chrono::milliseconds> timeout = kDefaultCallTimeout,
      bool cancel_on_fork = false);

  // The Session stream, opened when there is none or it broke (waits while a fork() is being
  // prepared). It counts as a call in flight until its last holder lets go of it.
  absl::StatusOr<std::shared_ptr<SessionStream>> Stream();
  absl::StatusOr<tensord::v1::SessionResponse> StreamCall(tensord::v1::SessionRequest request,
                                                          std::optional<std::chrono::milliseconds> wait,
                                                          CancelState* cancel = nullptr);
  // CallMany on the stream, retrying what a fork's drain interrupted on the next stream; an
  // error reply becomes that element's status. `cancel` (may be null) as CallMany's: a call
  // it cancelled is not retried.
  std::vector<absl::StatusOr<tensord::v1::SessionResponse>> StreamCallMany(
      std::vector<tensord::v1::SessionRequest> requests,
      std::optional<std::chrono::milliseconds> wait, CancelState* cancel = nullptr);
  // Sends `request` on the stream and returns at once; Await() gets its reply. A call a
  // fork's drain interrupted is not retried: its caller asks again if it still wants it.
  absl::StatusOr<std::unique_ptr<SessionStream::PendingCall>> StreamStart(tensord::v1::SessionRequest request);
  // The reply of a started call, an error reply as its status, waiting up to `wait`.
  static absl::StatusOr<tensord::v1::SessionResponse> Await(SessionStream::PendingCall& call,
                                                            std::chrono::milliseconds wait);
  // Opens a stream unless one is open and unbroken (without waiting for a fork then).
  void KeepStreamOpen();
  // Closes the stream where it is: calls on it fail from now on (process exit).
  void CloseStream();
  // Closes the stream and lets go of it (the session's end).
  void DropStream();

  // Fork parent, around fork() (see Session::SuspendForFork): new calls wait, cancel_on_fork
  // calls are cancelled, the stream is drained and dropped, and once no call is in flight the
  // connection is dropped. False when a call was still in flight at `deadline` (the
  // connection stays).
  bool SuspendForFork(std::chrono::steady_clock::time_point deadline);
  void ResumeAfterFork();
  // Fork child: marks the session forked away, closing and dead, and leaks the parent's
  // stream and connection without running a destructor. Takes no lock.
  void AbandonInForkedChild() noexcept;
  // Whether the parent's fork() left this session behind in this (child) process.
  bool forked_away() const { return forked_away_.load(std::memory_order_acquire); }

  // The current gRPC connection (nullptr when there is none).
  std::shared_ptr<GrpcConnection> connection_for_test();

 private:
  // The gRPC connection, made on first use after construction or a fork, and again when the
  // broker closed it while the session lives.
  absl::StatusOr<std::shared_ptr<GrpcConnection>> ConnectionLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<grpc::ClientContext> NewContext(std::optional<std::chrono::milliseconds> timeout) const;
  void EndCall();
  void AwaitNoForkLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t fork_epoch_seen() const { return fork_epoch_.load(std::memory_order_acquire); }
  // A wait retried after a fork asks the broker only for what is left of it.
  // A reply as a status: a transport failure, or the broker's error reply.
  static absl::StatusOr<tensord::v1::SessionResponse> ReplyStatus(
      absl::StatusOr<tensord::v1::SessionResponse> reply);
  static void ShortenWait(tensord::v1::SessionRequest& request,
                          std::optional<SessionStream::Clock::time_point> deadline);

  const std::string socket_path_;
  const FdConnection& fd_;
  const std::vector<uint32_t> trusted_uids_;
  const Handlers handlers_;
  std::atomic<bool> dead_{false};
  std::atomic<bool> closing_{false};
  std::atomic<uint64_t> fork_epoch_{0};
  std::atomic<bool> forked_away_{false};

  // Every gRPC object of the session: created on demand, all dropped for a fork.
  absl::Mutex mu_;
  std::shared_ptr<GrpcConnection> connection_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<SessionStream> stream_ ABSL_GUARDED_BY(mu_);
  bool fork_suspended_ ABSL_GUARDED_BY(mu_) = false;
  int calls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<grpc::ClientContext*> fork_cancellable_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensord::internal
