// BrokerService: the gRPC transport (callback API) for tensord.v1.Broker. A thin layer: it
// authenticates the session token from the `tensord-session` metadata, hands each request
// to the Broker and turns its answers into gRPC responses. Handlers never block: waits are
// completed by the Broker from whichever thread publishes or times out.
//
// The Session stream answers requests in order of completion (each response carries its
// request's seq), forwards the Broker's pushes, and applies backpressure: it stops reading
// while too many responses are queued, and a push queue that overflows is replaced by a
// single cache_reset.
#pragma once

#include "server/broker.h"
#include "tensord/v1/broker.grpc.pb.h"

namespace tensord::server {

class BrokerService final : public tensord::v1::Broker::CallbackService {
 public:
  explicit BrokerService(Broker* broker) : broker_(broker) {}

  grpc::ServerBidiReactor<tensord::v1::SessionRequest, tensord::v1::SessionResponse>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* context,
                                     const tensord::v1::AllocateRequest* request,
                                     tensord::v1::AllocateResponse* response) override;
  grpc::ServerUnaryReactor* Export(grpc::CallbackServerContext* context,
                                   const tensord::v1::ExportRequest* request,
                                   tensord::v1::AllocateResponse* response) override;
  grpc::ServerUnaryReactor* Publish(grpc::CallbackServerContext* context,
                                    const tensord::v1::PublishRequest* request,
                                    tensord::v1::PublishResponse* response) override;
  grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* context,
                                    const tensord::v1::AcquireRequest* request,
                                    tensord::v1::AcquireResponse* response) override;
  grpc::ServerUnaryReactor* Take(grpc::CallbackServerContext* context,
                                 const tensord::v1::TakeRequest* request,
                                 tensord::v1::AcquireResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const tensord::v1::ReleaseRequest* request,
                                    tensord::v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const tensord::v1::DeleteRequest* request,
                                   tensord::v1::DeleteResponse* response) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* context,
                                 const tensord::v1::ListRequest* request,
                                 tensord::v1::ListResponse* response) override;
  grpc::ServerUnaryReactor* Stat(grpc::CallbackServerContext* context,
                                 const tensord::v1::StatRequest* request,
                                 tensord::v1::StatResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const tensord::v1::StatusRequest* request,
                                   tensord::v1::StatusResponse* response) override;
  grpc::ServerWriteReactor<tensord::v1::WatchEvent>* Watch(
      grpc::CallbackServerContext* context, const tensord::v1::WatchRequest* request) override;

 private:
  Broker* const broker_;
};

}  // namespace tensord::server
