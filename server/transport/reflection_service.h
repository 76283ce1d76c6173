// ReflectionService: gRPC server reflection (grpc.reflection.v1alpha.ServerReflection) on
// the AsyncServer, so that grpcurl and grpc_cli can list the daemon's services and call its
// methods without the .proto files. Needs no session.
//
// Answers from the descriptors compiled into the daemon: list_services names every service
// the AsyncServer routes; file_by_filename, file_containing_symbol and
// file_containing_extension send the file and every file it depends on;
// all_extension_numbers_of_type lists the extensions declared in the services' files. A name it does not know is
// answered with an error_response (NOT_FOUND) on the stream, which stays open. Thread-safe.
#pragma once

#include "server/transport/async_server.h"

namespace tensord::server {

class ReflectionService {
 public:
  // Routes ServerReflectionInfo on `server` here; `server` must outlive the calls.
  void Register(AsyncServer* server);
};

}  // namespace tensord::server
