#include "server/transport/async_server.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "spdlog/spdlog.h"

namespace tensord::server {
namespace {

// Calls asked for ahead, so a burst of new calls does not wait for one another.
constexpr int kWaitingSlots = 4;

// A method nobody registered.
class UnimplementedCall final : public ServerCall {
  void OnStart() override {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        absl::StrCat("tensord serves no method ", context().method())));
  }
};

}  // namespace

// A call gRPC will hand over: its context and stream, asked for before anyone knows which
// method it is. The "done" tag is set on the context before the call arrives, so it lives
// here and reaches the ServerCall once there is one.
class CallSlot {
 public:
  explicit CallSlot(AsyncServer* server) : server_(server) {}

  grpc::GenericServerContext context;
  grpc::GenericServerAsyncReaderWriter stream{&context};
  ServerCall* call = nullptr;

  class ArrivedTag final : public CompletionTag {
   public:
    explicit ArrivedTag(CallSlot* slot) : slot_(slot) {}
    void Complete(bool ok) override { slot_->server_->Arrived(std::unique_ptr<CallSlot>(slot_), ok); }

   private:
    CallSlot* const slot_;
  };
  class DoneTag final : public CompletionTag {
   public:
    explicit DoneTag(CallSlot* slot) : slot_(slot) {}
    void Complete(bool ok) override {
      if (slot_->call != nullptr) slot_->call->Completed(ServerCall::Op::kDone, ok);
    }

   private:
    CallSlot* const slot_;
  };
  ArrivedTag arrived{this};
  DoneTag done{this};

 private:
  AsyncServer* const server_;
};

ServerCall::ServerCall() = default;
ServerCall::~ServerCall() = default;

const grpc::GenericServerContext& ServerCall::context() const { return slot_->context; }

template <typename Start>
void ServerCall::Begin(Op op, Start start) {
  absl::ReaderMutexLock queue_lock(&server_->queue_mu_);
  if (server_->stopping_) {
    // Only a call that outlived the server's shutdown gets here (Stop reports it).
    spdlog::error("gRPC call {}: an operation after the server stopped", context().method());
    return;
  }
  // Started under the lock: gRPC's bookkeeping of the initial metadata is not thread-safe,
  // and a write from a broker thread may race a metadata send from the polling thread.
  absl::MutexLock lock(&mu_);
  if (op == Op::kMetadata && metadata_sent_) return;  // a write already carried it
  if (finish_started_) {
    spdlog::error("gRPC call {}: an operation after its finish", context().method());
    return;
  }
  if (op != Op::kRead) metadata_sent_ = true;
  if (op == Op::kFinish) {
    finish_started_ = true;
  } else {
    ++in_flight_;
  }
  start();
}

void ServerCall::StartRead(grpc::ByteBuffer* message) {
  Begin(Op::kRead, [&] { slot_->stream.Read(message, &read_tag_); });
}

void ServerCall::StartWrite(const grpc::ByteBuffer* message) {
  Begin(Op::kWrite, [&] { slot_->stream.Write(*message, &write_tag_); });
}

void ServerCall::StartSendInitialMetadata() {
  Begin(Op::kMetadata, [&] { slot_->stream.SendInitialMetadata(&metadata_tag_); });
}

void ServerCall::Finish(const grpc::Status& status) {
  Begin(Op::kFinish, [&] { slot_->stream.Finish(status, &finish_tag_); });
}

void ServerCall::WriteAndFinish(const grpc::ByteBuffer* message) {
  Begin(Op::kFinish,
        [&] { slot_->stream.WriteAndFinish(*message, grpc::WriteOptions(), grpc::Status::OK, &finish_tag_); });
}

void ServerCall::Completed(Op op, bool ok) {
  {
    absl::MutexLock lock(&mu_);
    switch (op) {
      case Op::kFinish:
        finish_done_ = true;
        break;
      case Op::kDone:
        done_ = true;
        break;
      default:
        --in_flight_;
    }
  }
  switch (op) {
    case Op::kRead:
      OnReadDone(ok);
      break;
    case Op::kWrite:
      OnWriteDone(ok);
      break;
    case Op::kDone:
      if (slot_->context.IsCancelled()) OnCancel();
      break;
    case Op::kMetadata:
    case Op::kFinish:
      break;
  }
  bool over = false;
  {
    absl::MutexLock lock(&mu_);
    over = finish_done_ && done_ && in_flight_ == 0;
  }
  // Only this thread completes operations, and nothing starts after Finish: nobody else
  // can be looking at the call now.
  if (over) {
    OnDone();
    server_->Forget();
    delete this;
  }
}

void SingleRequestCall::OnReadDone(bool ok) {
  if (!ok) {
    // The client went away, or half-closed without sending its request.
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call ended before its request came"));
    return;
  }
  OnRequest(request_);
}

void UnaryServerCall::Respond(const grpc::ByteBuffer& response) {
  response_ = response;
  WriteAndFinish(&response_);
}

void UnaryServerCall::Respond(const grpc::Status& status) { Finish(status); }

AsyncServer::AsyncServer() = default;
AsyncServer::~AsyncServer() { Stop(); }

void AsyncServer::Handle(const std::string& method, CallFactory factory) {
  handlers_[method] = std::move(factory);
}

std::vector<std::string> AsyncServer::ServiceNames() const {
  std::vector<std::string> names;
  for (const auto& [method, factory] : handlers_) {
    // "/package.Service/Method"
    size_t slash = method.rfind('/');
    if (slash == std::string::npos || slash == 0) continue;
    std::string name = method.substr(1, slash - 1);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

void AsyncServer::Configure(grpc::ServerBuilder* builder) {
  builder->RegisterAsyncGenericService(&generic_);
  queue_ = builder->AddCompletionQueue(/*is_frequently_polled=*/true);
}

void AsyncServer::Start(grpc::Server* server) {
  server_ = server;
  for (int i = 0; i < kWaitingSlots; ++i) RequestCall();
  thread_ = std::thread([this] { Poll(); });
  pthread_setname_np(thread_.native_handle(), "tensord-grpc");
}

void AsyncServer::RequestCall() {
  auto slot = std::make_unique<CallSlot>(this);
  slot->context.AsyncNotifyWhenDone(&slot->done);
  absl::ReaderMutexLock lock(&queue_mu_);
  if (stopping_) return;
  // The queue owns the slot until it hands it back through Arrived.
  CallSlot* raw = slot.release();
  generic_.RequestCall(&raw->context, &raw->stream, queue_.get(), queue_.get(), &raw->arrived);
}

void AsyncServer::Arrived(std::unique_ptr<CallSlot> slot, bool ok) {
  if (!ok) {
    // The server is shutting down. Whether gRPC still delivers the slot's done tag is not
    // promised: the slot stays until the queue is drained.
    unused_slots_.push_back(std::move(slot));
    return;
  }
  RequestCall();
  auto handler = handlers_.find(slot->context.method());
  std::unique_ptr<ServerCall> call =
      handler != handlers_.end() ? handler->second(slot->context) : std::make_unique<UnimplementedCall>();
  call->server_ = this;
  slot->call = call.get();
  call->slot_ = std::move(slot);
  live_calls_.fetch_add(1, std::memory_order_relaxed);
  call.release()->OnStart();  // deletes itself once done
}

void AsyncServer::Forget() { live_calls_.fetch_sub(1, std::memory_order_relaxed); }

void AsyncServer::Poll() {
  void* tag = nullptr;
  bool ok = false;
  while (queue_->Next(&tag, &ok)) static_cast<CompletionTag*>(tag)->Complete(ok);
}

void AsyncServer::Shutdown(std::chrono::milliseconds drain) {
  if (server_ == nullptr) return;
  auto deadline = std::chrono::steady_clock::now() + drain;
  // gRPC's Shutdown blocks until every call and connection is gone; its own deadline would
  // also wait out idle connections, so it gets a late one and the drain is ended here.
  std::thread shutdown([this, drain] { server_->Shutdown(std::chrono::system_clock::now() + 2 * drain); });
  while (live_calls_.load(std::memory_order_relaxed) > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  grpc_server_cancel_all_calls(server_->c_server());
  shutdown.join();
  server_->Wait();
  Stop();
}

void AsyncServer::Stop() {
  if (!thread_.joinable()) return;
  {
    absl::WriterMutexLock lock(&queue_mu_);
    stopping_ = true;
    queue_->Shutdown();
  }
  thread_.join();
  // gRPC's Shutdown returns only once every call's context is gone, so none is left.
  if (size_t left = live_calls_.load(); left > 0) spdlog::error("{} gRPC calls outlived the server's shutdown", left);
  unused_slots_.clear();
}

}  // namespace tensord::server
