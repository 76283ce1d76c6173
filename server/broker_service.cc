#include "server/broker_service.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/grpc_status.h"
#include "server/session_stream.h"
#include "server/watch_stream.h"
#include "server/wire_messages.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

constexpr char kSessionMetadata[] = "tensord-session";

// One unary call. Its result may come from any thread, before or after Begin returns; a
// wait it started is cancelled when the client cancels.
template <typename Response>
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(Broker* broker, grpc::ByteBuffer* response)
      : broker_(broker), response_(response), state_(std::make_shared<State>()) {}

  template <typename Start>
  void Begin(Start start) {
    std::shared_ptr<State> state = state_;  // `this` may be gone once start() returns
    Broker* broker = broker_;
    uint64_t id = start(Completion<Response>(
        [this](absl::StatusOr<Response> result) { Complete(std::move(result)); }));
    bool cancel_now = false;
    {
      absl::MutexLock lock(&state->mu);
      state->wait_id = id;
      cancel_now = state->cancelled && id != 0;
    }
    if (cancel_now) broker->CancelWait(id);
  }

  void Complete(absl::StatusOr<Response> result) {
    absl::Status status = result.status();
    if (result.ok()) status = SerializeResponse(*result, response_);
    Finish(ToGrpcStatus(status));
  }

  void OnCancel() override {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&state_->mu);
      state_->cancelled = true;
      id = state_->wait_id;
    }
    if (id != 0) broker_->CancelWait(id);
  }
  void OnDone() override { delete this; }

 private:
  struct State {
    absl::Mutex mu;
    uint64_t wait_id ABSL_GUARDED_BY(mu) = 0;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
  };

  Broker* const broker_;
  grpc::ByteBuffer* const response_;
  std::shared_ptr<State> state_;
};

// A handler for Serve that answers at once with answer(session, request).
template <typename Request, typename Response, typename Answer>
auto AnswerNow(Answer answer) {
  return [answer](uint64_t session, const Request& request, Completion<Response> done) {
    std::move(done)(absl::StatusOr<Response>(answer(session, request)));
    return uint64_t{0};
  };
}

}  // namespace

absl::StatusOr<uint64_t> BrokerService::Authenticate(grpc::CallbackServerContext* context) const {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kSessionMetadata);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "missing 'tensord-session' metadata: open a session on the fd channel first");
  }
  std::string peer = context->peer();
  std::optional<common::PeerCredentials> creds = peers_->Lookup(peer);
  if (!creds) {
    return absl::UnauthenticatedError(absl::StrCat("the credentials of gRPC connection ", peer,
                                                   " are unknown: connect to the daemon's socket"));
  }
  return broker_->Authenticate(std::string_view(it->second.data(), it->second.size()), *creds);
}

template <typename Request, typename Response, typename Handler>
grpc::ServerUnaryReactor* BrokerService::Serve(grpc::CallbackServerContext* context, const Bytes* bytes,
                                               Bytes* response, Handler handler) {
  auto* call = new UnaryCall<Response>(broker_, response);
  Request request;
  absl::Status parsed = ParseRequest(*bytes, &request);
  absl::StatusOr<uint64_t> session = parsed.ok() ? Authenticate(context) : absl::StatusOr<uint64_t>(parsed);
  if (!session.ok()) {
    call->Complete(session.status());
    return call;
  }
  // The Broker reads the request before it returns; `request` may go with this frame.
  call->Begin([&](Completion<Response> done) { return handler(*session, request, std::move(done)); });
  return call;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* BrokerService::Session(
    grpc::CallbackServerContext* context) {
  return NewSessionStream(broker_, Authenticate(context));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* BrokerService::Watch(grpc::CallbackServerContext* context,
                                                                 const Bytes* request) {
  return NewWatchStream(broker_, Authenticate(context), *request);
}

grpc::ServerUnaryReactor* BrokerService::Allocate(grpc::CallbackServerContext* context, const Bytes* request,
                                                  Bytes* response) {
  return Serve<v1::AllocateRequest, v1::AllocateResponse>(
      context, request, response,
      [this](uint64_t session, const v1::AllocateRequest& r, Completion<v1::AllocateResponse> done) {
        broker_->Allocate(session, r, std::move(done));
        return uint64_t{0};
      });
}

grpc::ServerUnaryReactor* BrokerService::Export(grpc::CallbackServerContext* context, const Bytes* request,
                                                Bytes* response) {
  return Serve<v1::ExportRequest, v1::AllocateResponse>(
      context, request, response,
      AnswerNow<v1::ExportRequest, v1::AllocateResponse>(
          [this](uint64_t session, const v1::ExportRequest& request) { return broker_->Export(session, request); }));
}

grpc::ServerUnaryReactor* BrokerService::Publish(grpc::CallbackServerContext* context, const Bytes* request,
                                                 Bytes* response) {
  return Serve<v1::PublishRequest, v1::PublishResponse>(
      context, request, response,
      AnswerNow<v1::PublishRequest, v1::PublishResponse>(
          [this](uint64_t session, const v1::PublishRequest& request) { return broker_->Publish(session, request); }));
}

grpc::ServerUnaryReactor* BrokerService::Acquire(grpc::CallbackServerContext* context, const Bytes* request,
                                                 Bytes* response) {
  return Serve<v1::AcquireRequest, v1::AcquireResponse>(
      context, request, response,
      [this](uint64_t session, const v1::AcquireRequest& r, Completion<v1::AcquireResponse> done) {
        return broker_->Acquire(session, r, std::move(done));
      });
}

grpc::ServerUnaryReactor* BrokerService::Take(grpc::CallbackServerContext* context, const Bytes* request,
                                              Bytes* response) {
  return Serve<v1::TakeRequest, v1::AcquireResponse>(
      context, request, response,
      [this](uint64_t session, const v1::TakeRequest& r, Completion<v1::AcquireResponse> done) {
        return broker_->Take(session, r, std::move(done));
      });
}

grpc::ServerUnaryReactor* BrokerService::Release(grpc::CallbackServerContext* context, const Bytes* request,
                                                 Bytes* response) {
  return Serve<v1::ReleaseRequest, v1::ReleaseResponse>(
      context, request, response,
      AnswerNow<v1::ReleaseRequest, v1::ReleaseResponse>(
          [this](uint64_t session, const v1::ReleaseRequest& request) { return broker_->Release(session, request); }));
}

grpc::ServerUnaryReactor* BrokerService::Delete(grpc::CallbackServerContext* context, const Bytes* request,
                                                Bytes* response) {
  return Serve<v1::DeleteRequest, v1::DeleteResponse>(
      context, request, response,
      AnswerNow<v1::DeleteRequest, v1::DeleteResponse>(
          [this](uint64_t session, const v1::DeleteRequest& request) { return broker_->Delete(session, request); }));
}

grpc::ServerUnaryReactor* BrokerService::List(grpc::CallbackServerContext* context, const Bytes* request,
                                              Bytes* response) {
  return Serve<v1::ListRequest, v1::ListResponse>(
      context, request, response,
      AnswerNow<v1::ListRequest, v1::ListResponse>(
          [this](uint64_t session, const v1::ListRequest& request) { return broker_->List(session, request); }));
}

grpc::ServerUnaryReactor* BrokerService::Stat(grpc::CallbackServerContext* context, const Bytes* request,
                                              Bytes* response) {
  return Serve<v1::StatRequest, v1::StatResponse>(
      context, request, response,
      AnswerNow<v1::StatRequest, v1::StatResponse>(
          [this](uint64_t session, const v1::StatRequest& request) { return broker_->Stat(session, request); }));
}

grpc::ServerUnaryReactor* BrokerService::Status(grpc::CallbackServerContext* context, const Bytes* request,
                                                Bytes* response) {
  return Serve<v1::StatusRequest, v1::StatusResponse>(
      context, request, response,
      AnswerNow<v1::StatusRequest, v1::StatusResponse>(
          [this](uint64_t, const v1::StatusRequest&) { return broker_->GetStatus(); }));
}

}  // namespace tensord::server
