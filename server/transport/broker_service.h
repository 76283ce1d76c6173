// BrokerService: the gRPC transport for tensord.v1.Broker. A thin layer: it authenticates
// the session token from the `tensord-session` metadata together with the credentials of the
// connection the call came on (a PeerDirectory knows them), hands each request to the Broker
// and turns its answers into gRPC responses. Handlers never block: waits are completed by
// the Broker from whichever thread publishes or times out.
//
// Every method is served raw (bytes in, bytes out, on the AsyncServer) and parses its
// request itself, so a request that does not decode is answered INVALID_ARGUMENT naming the
// message type. The streams live in session_stream.h and watch_stream.h.
#pragma once

#include <optional>
#include <string_view>

#include "common/fd_channel.h"
#include "server/broker/broker.h"
#include "server/metrics/rpc_metrics.h"
#include "server/transport/async_server.h"
#include "server/transport/status_supplements.h"

namespace tensord::server {

// The SO_PEERCRED credentials of a gRPC connection, by the peer string gRPC gives its calls.
class PeerDirectory {
 public:
  virtual ~PeerDirectory() = default;
  // nullopt when the connection is unknown (then every call on it is UNAUTHENTICATED).
  virtual std::optional<common::PeerCredentials> Lookup(std::string_view peer) const = 0;
};

class BrokerService final {
 public:
  // All must outlive the service; `metrics` may be null (nothing is counted), and
  // `supplements` (what Status answers add to the broker's) too.
  BrokerService(Broker* broker, const PeerDirectory* peers, RpcMetrics* metrics = nullptr,
                StatusSupplements* supplements = nullptr)
      : broker_(broker), peers_(peers), metrics_(metrics), supplements_(supplements) {}

  // Routes every tensord.v1.Broker method on `server` to this service.
  void Register(AsyncServer* server);

  // The session a call's metadata names, if the connection it came on may use it.
  absl::StatusOr<uint64_t> Authenticate(const grpc::ServerContextBase& context) const;

 private:
  // Routes `method` to a unary call that parses its Request, authenticates, and runs
  // handler(session, request, done), which calls done(StatusOr<Response>) exactly once and
  // returns a wait id to cancel when the client cancels (0: nothing to cancel).
  template <typename Request, typename Response, typename Handler>
  void Unary(AsyncServer* server, RpcMethod method, Handler handler);
  // The same for a handler that answers at once: answer(session, request) -> StatusOr<Response>.
  template <typename Request, typename Response, typename Answer>
  void UnaryNow(AsyncServer* server, RpcMethod method, Answer answer);

  Broker* const broker_;
  const PeerDirectory* const peers_;
  RpcMetrics* const metrics_;
  StatusSupplements* const supplements_;
};

}  // namespace tensord::server
