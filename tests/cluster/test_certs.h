// Certificates for TLS tests, made with the openssl command (Debian's openssl) in a folder
// of the test's: a CA, a server certificate for 127.0.0.1 and a client certificate signed
// by it, and a second, rogue CA with a client certificate of its own. EC P-256 keys, valid
// for two days. Paths are absolute.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tensord::testing {

struct TestCertificates {
  std::string ca;
  std::string server_cert, server_key;
  std::string client_cert, client_key;
  std::string rogue_ca;
  std::string rogue_client_cert, rogue_client_key;
};

absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir);

}  // namespace tensord::testing
