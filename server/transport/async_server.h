// AsyncServer: every gRPC call the daemon serves, on gRPC's async API, driven by one thread
// of ours that polls one completion queue.
//
// Why not gRPC's callback or sync API: with either, gRPC runs threads of its own (at least
// two "nexting" threads for callback services) that take turns polling the sockets and hand
// each message to one another: a few context switches per message, and on a small node a
// third of the daemon's CPU per request (docs/performance.md). With every method on the
// async API, one thread reads a request, runs its handler and writes the reply.
//
// Calls arrive through one grpc::AsyncGenericService, as raw bytes, and are routed by their
// method path ("/tensord.v1.Broker/Session") to the factory registered for it; a path nobody
// registered is answered UNIMPLEMENTED. A ServerCall mirrors gRPC's callback reactors
// (StartRead/StartWrite/Finish in, OnReadDone/OnWriteDone/OnCancel/OnDone out), so a call's
// logic reads as it would there.
//
// Threading: every On* hook runs on the polling thread; Start*/Finish may be called from any
// thread (the broker completes waits from its timer and executor threads), one read and one
// write in flight at a time, as with reactors. Handlers must not block: they block the whole
// server.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"

namespace tensord::server {

class AsyncServer;
class CallSlot;

// What the completion queue hands back: every tag the server uses is one of these.
class CompletionTag {
 public:
  virtual void Complete(bool ok) = 0;

 protected:
  ~CompletionTag() = default;
};

// One call. Made by the factory registered for its method when the call arrives; the server
// deletes it once it finished, gRPC reported the call done and no read or write is in flight
// (after OnDone).
class ServerCall {
 public:
  ServerCall();
  ServerCall(const ServerCall&) = delete;
  ServerCall& operator=(const ServerCall&) = delete;
  virtual ~ServerCall();

  // The call's metadata, peer and method. Valid from OnStart on.
  const grpc::GenericServerContext& context() const;

  // At most one read and one write (or finish) in flight; nothing is started after Finish.
  // Any thread.
  void StartRead(grpc::ByteBuffer* message);
  void StartWrite(const grpc::ByteBuffer* message);
  // Sends the initial metadata now (a no-op once a write or finish has carried it).
  void StartSendInitialMetadata();
  void Finish(const grpc::Status& status);
  // The reply of a unary call and its OK status in one operation.
  void WriteAndFinish(const grpc::ByteBuffer* message);

 protected:
  // The call has arrived; start reading (or finish).
  virtual void OnStart() = 0;
  virtual void OnReadDone(bool /*ok*/) {}
  virtual void OnWriteDone(bool /*ok*/) {}
  // The client cancelled or the connection broke before the call finished; pending reads
  // and writes fail, and Finish must still be called.
  virtual void OnCancel() {}
  // Nothing more happens to this call; it is deleted right after.
  virtual void OnDone() {}

 private:
  friend class AsyncServer;
  friend class CallSlot;
  enum class Op { kRead, kWrite, kMetadata, kFinish, kDone };
  class Tag final : public CompletionTag {
   public:
    Tag(ServerCall* call, Op op) : call_(call), op_(op) {}
    void Complete(bool ok) override { call_->Completed(op_, ok); }

   private:
    ServerCall* const call_;
    const Op op_;
  };

  // Starts an operation unless the server is stopping (then it completes as failed, at once).
  template <typename Start>
  void Begin(Op op, Start start);
  // Runs on the polling thread.
  void Completed(Op op, bool ok);

  // Set by the server before OnStart. The slot holds the context and the stream, and the
  // tag of gRPC's "call done" notification (chosen before the call arrived).
  AsyncServer* server_ = nullptr;
  std::unique_ptr<CallSlot> slot_;

  Tag read_tag_{this, Op::kRead};
  Tag write_tag_{this, Op::kWrite};
  Tag metadata_tag_{this, Op::kMetadata};
  Tag finish_tag_{this, Op::kFinish};

  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // reads, writes and metadata sends
  bool metadata_sent_ ABSL_GUARDED_BY(mu_) = false;  // by a write, a finish or on its own
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_done_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // gRPC's "call done" notification came
};

// A call whose client sends one request (unary or server-streaming): reads it, then
// OnRequest; a call that ends before its request came finishes CANCELLED.
class SingleRequestCall : public ServerCall {
 protected:
  // The request; runs on the polling thread.
  virtual void OnRequest(const grpc::ByteBuffer& request) = 0;

 private:
  void OnStart() final { StartRead(&request_); }
  void OnReadDone(bool ok) final;

  grpc::ByteBuffer request_;
};

// A unary call: OnRequest answers through Respond.
class UnaryServerCall : public SingleRequestCall {
 protected:
  // Exactly once, from any thread: `response` (OK) or `status` (not OK) for the client.
  void Respond(const grpc::ByteBuffer& response);
  void Respond(const grpc::Status& status);

 private:
  grpc::ByteBuffer response_;
};

class AsyncServer {
 public:
  // Makes the call object for a call that arrived (its metadata and peer are known).
  using CallFactory = std::function<std::unique_ptr<ServerCall>(const grpc::GenericServerContext&)>;

  AsyncServer();
  AsyncServer(const AsyncServer&) = delete;
  AsyncServer& operator=(const AsyncServer&) = delete;
  ~AsyncServer();

  // Routes calls to `method` ("/package.Service/Method") to calls `factory` makes. Before
  // Configure.
  void Handle(const std::string& method, CallFactory factory);
  // The services with a handled method, by full name ("tensord.v1.Broker"), sorted.
  std::vector<std::string> ServiceNames() const;

  // Registers the generic service and the completion queue with `builder`.
  void Configure(grpc::ServerBuilder* builder);
  // After builder.BuildAndStart(): starts the polling thread.
  void Start(grpc::Server* server);
  // Shuts the server down: no new calls; the calls in flight get up to `drain` to end, then
  // whatever is left is cancelled and the connections are dropped (gRPC alone would wait
  // the whole drain for every connected client to hang up, busy or not). Then Stop().
  void Shutdown(std::chrono::milliseconds drain);
  // After the server shut down: shuts the queue down, drains it and joins the thread.
  void Stop();

 private:
  friend class ServerCall;
  friend class CallSlot;

  // Asks gRPC for the next call (unless stopping).
  void RequestCall();
  void Arrived(std::unique_ptr<CallSlot> slot, bool ok);
  void Poll();
  void Forget();  // a call was deleted

  absl::flat_hash_map<std::string, CallFactory> handlers_;  // constant after Configure
  grpc::AsyncGenericService generic_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  grpc::Server* server_ = nullptr;
  std::thread thread_;

  // Operations are started under a reader lock and the queue is shut down under the writer
  // lock: no operation can start on a queue that is shut down.
  absl::Mutex queue_mu_;
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;

  // Calls made and not yet deleted (read by Shutdown's thread).
  std::atomic<size_t> live_calls_{0};
  // Slots whose call never came (the server shut down), kept until the queue is drained.
  // The polling thread's, then Stop's.
  std::vector<std::unique_ptr<CallSlot>> unused_slots_;
};

}  // namespace tensord::server
