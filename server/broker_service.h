// BrokerService: the gRPC transport (callback API) for tensord.v1.Broker. A thin layer: it
// authenticates the session token from the `tensord-session` metadata together with the
// credentials of the connection the call came on (a PeerDirectory knows them), hands each
// request to the Broker and turns its answers into gRPC responses. Handlers never block:
// waits are completed by the Broker from whichever thread publishes or times out.
//
// Every method is registered raw (bytes in, bytes out) and parses its request itself, so a
// request that does not decode is answered INVALID_ARGUMENT naming the message type (gRPC's
// typed callback path would answer a bare UNIMPLEMENTED, or end a stream as if the client
// had half-closed it). The streams live in session_stream.h and watch_stream.h.
#pragma once

#include <optional>
#include <string_view>

#include "common/fd_channel.h"
#include "server/broker.h"
#include "tensord/v1/broker.grpc.pb.h"

namespace tensord::server {

// The SO_PEERCRED credentials of a gRPC connection, by the peer string gRPC gives its calls.
class PeerDirectory {
 public:
  virtual ~PeerDirectory() = default;
  // nullopt when the connection is unknown (then every call on it is UNAUTHENTICATED).
  virtual std::optional<common::PeerCredentials> Lookup(std::string_view peer) const = 0;
};

namespace internal {
using B = tensord::v1::Broker;
using RawBrokerService = B::WithRawCallbackMethod_Session<B::WithRawCallbackMethod_Allocate<
    B::WithRawCallbackMethod_Export<B::WithRawCallbackMethod_Publish<B::WithRawCallbackMethod_Acquire<
        B::WithRawCallbackMethod_Take<B::WithRawCallbackMethod_Release<B::WithRawCallbackMethod_Delete<
            B::WithRawCallbackMethod_List<B::WithRawCallbackMethod_Stat<B::WithRawCallbackMethod_Watch<
                B::WithRawCallbackMethod_Status<B::Service>>>>>>>>>>>>;
}  // namespace internal

class BrokerService final : public internal::RawBrokerService {
 public:
  // Both must outlive the service.
  BrokerService(Broker* broker, const PeerDirectory* peers) : broker_(broker), peers_(peers) {}

  using Bytes = grpc::ByteBuffer;
  grpc::ServerBidiReactor<Bytes, Bytes>* Session(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* context, const Bytes* request,
                                     Bytes* response) override;
  grpc::ServerUnaryReactor* Export(grpc::CallbackServerContext* context, const Bytes* request,
                                   Bytes* response) override;
  grpc::ServerUnaryReactor* Publish(grpc::CallbackServerContext* context, const Bytes* request,
                                    Bytes* response) override;
  grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* context, const Bytes* request,
                                    Bytes* response) override;
  grpc::ServerUnaryReactor* Take(grpc::CallbackServerContext* context, const Bytes* request,
                                 Bytes* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context, const Bytes* request,
                                    Bytes* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context, const Bytes* request,
                                   Bytes* response) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* context, const Bytes* request,
                                 Bytes* response) override;
  grpc::ServerUnaryReactor* Stat(grpc::CallbackServerContext* context, const Bytes* request,
                                 Bytes* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context, const Bytes* request,
                                   Bytes* response) override;
  grpc::ServerWriteReactor<Bytes>* Watch(grpc::CallbackServerContext* context,
                                         const Bytes* request) override;

 private:
  absl::StatusOr<uint64_t> Authenticate(grpc::CallbackServerContext* context) const;
  // Parses the request, authenticates, and runs handler(session, request, done), which
  // calls done(StatusOr<Response>) exactly once and returns a wait id to cancel when the
  // client cancels (0: nothing to cancel).
  template <typename Request, typename Response, typename Handler>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context, const Bytes* request,
                                  Bytes* response, Handler handler);

  Broker* const broker_;
  const PeerDirectory* const peers_;
};

}  // namespace tensord::server
