#include "server/transport/broker_service.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/transport/grpc_status.h"
#include "server/transport/session_stream.h"
#include "server/transport/watch_stream.h"
#include "server/transport/wire_messages.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::server {

namespace v1 = tensord::v1;

namespace {

constexpr char kSessionMetadata[] = "tensord-session";
constexpr char kMethodPrefix[] = "/tensord.v1.Broker/";

// One unary Broker call. Its result may come from any thread, before or after the handler
// returns; a wait it started is cancelled when the client cancels. OnRequest and OnCancel
// both run on the polling thread, and the call is deleted there too, only after it has
// responded: neither needs a lock, and `this` outlives OnRequest.
template <typename Request, typename Response, typename Handler>
class BrokerUnaryCall final : public UnaryServerCall {
 public:
  BrokerUnaryCall(Broker* broker, absl::StatusOr<uint64_t> session, const Handler& handler, RpcMetrics* metrics,
                  RpcMethod method)
      : broker_(broker), session_(std::move(session)), handler_(handler), metrics_(metrics), method_(method) {}

 private:
  void OnRequest(const grpc::ByteBuffer& bytes) override {
    timer_ = RpcMetrics::Start(metrics_, method_, RpcTransport::kUnary);
    Request request;
    absl::Status parsed = ParseRequest(bytes, &request);
    if (!parsed.ok()) return Fail(parsed);
    if (!session_.ok()) return Fail(session_.status());
    // The Broker reads the request before it returns; `request` may go with this frame.
    wait_id_ = handler_(*session_, request, Completion<Response>([this](absl::StatusOr<Response> result) {
                          Complete(std::move(result));
                        }));
    if (cancelled_ && wait_id_ != 0) broker_->CancelWait(wait_id_);
  }

  void OnCancel() override {
    cancelled_ = true;
    if (wait_id_ != 0) broker_->CancelWait(wait_id_);
  }

  void Complete(absl::StatusOr<Response> result) {
    if (!result.ok()) return Fail(result.status());
    grpc::ByteBuffer bytes;
    if (absl::Status serialized = SerializeResponse(*result, &bytes); !serialized.ok()) return Fail(serialized);
    timer_.Done(absl::StatusCode::kOk);
    Respond(bytes);
  }

  void Fail(const absl::Status& status) {
    timer_.Done(status.code());
    Respond(ToGrpcStatus(status));
  }

  Broker* const broker_;
  const absl::StatusOr<uint64_t> session_;
  const Handler handler_;
  RpcMetrics* const metrics_;
  const RpcMethod method_;
  RpcMetrics::Timer timer_;
  uint64_t wait_id_ = 0;
  bool cancelled_ = false;
};

}  // namespace

absl::StatusOr<uint64_t> BrokerService::Authenticate(const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kSessionMetadata);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "missing 'tensord-session' metadata: open a session on the fd channel first");
  }
  std::string peer = context.peer();
  std::optional<common::PeerCredentials> creds = peers_->Lookup(peer);
  if (!creds) {
    return absl::UnauthenticatedError(absl::StrCat("the credentials of gRPC connection ", peer,
                                                   " are unknown: connect to the daemon's socket"));
  }
  return broker_->Authenticate(std::string_view(it->second.data(), it->second.size()), *creds);
}

template <typename Request, typename Response, typename Handler>
void BrokerService::Unary(AsyncServer* server, RpcMethod method, Handler handler) {
  server->Handle(absl::StrCat(kMethodPrefix, RpcMethodName(method)),
                 [this, handler, method](const grpc::GenericServerContext& context) {
                   return std::make_unique<BrokerUnaryCall<Request, Response, Handler>>(
                       broker_, Authenticate(context), handler, metrics_, method);
                 });
}

template <typename Request, typename Response, typename Answer>
void BrokerService::UnaryNow(AsyncServer* server, RpcMethod method, Answer answer) {
  Unary<Request, Response>(server, method,
                           [answer](uint64_t session, const Request& request, Completion<Response> done) {
                             std::move(done)(absl::StatusOr<Response>(answer(session, request)));
                             return uint64_t{0};
                           });
}

void BrokerService::Register(AsyncServer* server) {
  Broker* broker = broker_;
  server->Handle(absl::StrCat(kMethodPrefix, "Session"), [this, broker](const grpc::GenericServerContext& context) {
    return NewSessionStream(broker, Authenticate(context), metrics_);
  });
  server->Handle(absl::StrCat(kMethodPrefix, "Watch"), [this, broker](const grpc::GenericServerContext& context) {
    return NewWatchStream(broker, Authenticate(context));
  });
  Unary<v1::AllocateRequest, v1::AllocateResponse>(
      server, RpcMethod::kAllocate,
      [broker](uint64_t session, const v1::AllocateRequest& request, Completion<v1::AllocateResponse> done) {
        return broker->Allocate(session, request, std::move(done));
      });
  Unary<v1::AcquireRequest, v1::AcquireResponse>(
      server, RpcMethod::kAcquire,
      [broker](uint64_t session, const v1::AcquireRequest& request, Completion<v1::AcquireResponse> done) {
        return broker->Acquire(session, request, std::move(done));
      });
  Unary<v1::TakeRequest, v1::AcquireResponse>(
      server, RpcMethod::kTake, [broker](uint64_t session, const v1::TakeRequest& request, Completion<v1::AcquireResponse> done) {
        return broker->Take(session, request, std::move(done));
      });
  UnaryNow<v1::ExportRequest, v1::AllocateResponse>(
      server, RpcMethod::kExport,
      [broker](uint64_t session, const v1::ExportRequest& request) { return broker->Export(session, request); });
  UnaryNow<v1::PublishRequest, v1::PublishResponse>(
      server, RpcMethod::kPublish,
      [broker](uint64_t session, const v1::PublishRequest& request) { return broker->Publish(session, request); });
  UnaryNow<v1::ReleaseRequest, v1::ReleaseResponse>(
      server, RpcMethod::kRelease,
      [broker](uint64_t session, const v1::ReleaseRequest& request) { return broker->Release(session, request); });
  UnaryNow<v1::DeleteRequest, v1::DeleteResponse>(
      server, RpcMethod::kDelete,
      [broker](uint64_t session, const v1::DeleteRequest& request) { return broker->Delete(session, request); });
  UnaryNow<v1::ListRequest, v1::ListResponse>(
      server, RpcMethod::kList,
      [broker](uint64_t session, const v1::ListRequest& request) { return broker->List(session, request); });
  UnaryNow<v1::StatRequest, v1::StatResponse>(
      server, RpcMethod::kStat,
      [broker](uint64_t session, const v1::StatRequest& request) { return broker->Stat(session, request); });
  UnaryNow<v1::HandOverRequest, v1::HandOverResponse>(
      server, RpcMethod::kHandOver,
      [broker](uint64_t session, const v1::HandOverRequest& request) { return broker->HandOver(session, request); });
  UnaryNow<v1::StatusRequest, v1::StatusResponse>(
      server, RpcMethod::kStatus,
      [broker, supplements = supplements_](uint64_t session, const v1::StatusRequest& request) {
        v1::StatusResponse status = broker->GetStatus(request, session);
        if (supplements != nullptr) supplements->FillIn(status);
        return status;
      });
  UnaryNow<v1::CancelHandOversRequest, v1::CancelHandOversResponse>(
      server, RpcMethod::kCancelHandOvers, [broker](uint64_t session, const v1::CancelHandOversRequest& request) {
        return broker->CancelHandOvers(session, request);
      });
}

}  // namespace tensord::server
