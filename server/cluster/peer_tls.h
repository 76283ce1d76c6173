// The credentials brokers of a cluster show each other on the peer channel: mutual TLS with
// PEM files (one CA that signed every node's certificate; this node's certificate and key).
// A peer whose certificate the CA did not sign is refused by both sides. With no files,
// plaintext, only where the operator said so (--cluster-insecure on).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace tensord::server::cluster {

struct TlsFiles {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  bool insecure = false;  // no files: plaintext
};

struct PeerCredentials {
  std::shared_ptr<grpc::ServerCredentials> server;
  std::shared_ptr<grpc::ChannelCredentials> channel;
};

// Reads the files now: NOT_FOUND or PERMISSION_DENIED naming a file that cannot be read,
// INVALID_ARGUMENT for files given only in part, or none given without `insecure`.
absl::StatusOr<PeerCredentials> LoadPeerCredentials(const TlsFiles& files);

}  // namespace tensord::server::cluster
