#include "server/cluster/peer_tls.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tensord::server::cluster {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    return absl::Status(error == EACCES ? absl::StatusCode::kPermissionDenied : absl::StatusCode::kNotFound,
                        absl::StrCat("cluster TLS: the ", what, " ", path, ": ", strerror(error)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("cluster TLS: the ", what, " ", path, " holds no PEM block"));
  }
  return text.str();
}

}  // namespace

absl::StatusOr<PeerCredentials> LoadPeerCredentials(const TlsFiles& files) {
  const int given = !files.ca_file.empty() + !files.cert_file.empty() + !files.key_file.empty();
  if (given == 0) {
    if (!files.insecure) {
      return absl::InvalidArgumentError(
          "cluster: no TLS files (--cluster-ca-file, --cluster-cert-file, --cluster-key-file); brokers and etcd "
          "would talk in plaintext, unauthenticated. Give the files, or --cluster-insecure on for a trusted "
          "network");
    }
    return PeerCredentials{grpc::InsecureServerCredentials(), grpc::InsecureChannelCredentials()};
  }
  if (given != 3) {
    return absl::InvalidArgumentError(
        "cluster TLS: give all three of --cluster-ca-file, --cluster-cert-file and --cluster-key-file");
  }
  absl::StatusOr<std::string> ca = ReadPem(files.ca_file, "CA certificate");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadPem(files.cert_file, "certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(files.key_file, "key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions server(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  server.pem_root_certs = *ca;
  server.pem_key_cert_pairs.push_back({*key, *cert});
  grpc::SslCredentialsOptions channel;
  channel.pem_root_certs = *ca;
  channel.pem_private_key = *key;
  channel.pem_cert_chain = *cert;
  return PeerCredentials{grpc::SslServerCredentials(server), grpc::SslCredentials(channel)};
}

}  // namespace tensord::server::cluster
