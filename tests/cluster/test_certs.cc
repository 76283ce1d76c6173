#include "tests/cluster/test_certs.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tensord::testing {
namespace {

constexpr char kKey[] = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

absl::Status Openssl(const std::string& dir, const std::string& args) {
  const std::string command = absl::StrCat("cd '", dir, "' && openssl ", args, " >openssl.log 2>&1");
  if (std::system(command.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("`openssl ", args, "` failed; see ", dir, "/openssl.log"));
  }
  return absl::OkStatus();
}

// A CA: NAME.crt and NAME.key.
absl::Status MakeCa(const std::string& dir, const std::string& name) {
  return Openssl(dir, absl::StrCat("req -x509 ", kKey, " -keyout ", name, ".key -out ", name,
                                   ".crt -days 2 -subj /CN=", name));
}

// NAME.crt and NAME.key, signed by CA; extra: more `req` options (a subjectAltName).
absl::Status MakeSigned(const std::string& dir, const std::string& name, const std::string& ca,
                        const std::string& extra) {
  if (absl::Status s = Openssl(dir, absl::StrCat("req ", kKey, " -keyout ", name, ".key -out ", name,
                                                 ".csr -subj /CN=", name, " ", extra));
      !s.ok()) {
    return s;
  }
  return Openssl(dir, absl::StrCat("x509 -req -in ", name, ".csr -CA ", ca, ".crt -CAkey ", ca,
                                   ".key -CAcreateserial -out ", name, ".crt -days 2 -copy_extensions copy"));
}

}  // namespace

absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir) {
  for (absl::Status s : {MakeCa(dir, "ca"), MakeSigned(dir, "etcd", "ca", "-addext subjectAltName=IP:127.0.0.1"),
                         MakeSigned(dir, "node-a", "ca", ""), MakeCa(dir, "rogue-ca"),
                         MakeSigned(dir, "rogue-node", "rogue-ca", "")}) {
    if (!s.ok()) return s;
  }
  auto path = [&](const char* file) { return absl::StrCat(dir, "/", file); };
  return TestCertificates{.ca = path("ca.crt"),
                          .server_cert = path("etcd.crt"),
                          .server_key = path("etcd.key"),
                          .client_cert = path("node-a.crt"),
                          .client_key = path("node-a.key"),
                          .rogue_ca = path("rogue-ca.crt"),
                          .rogue_client_cert = path("rogue-node.crt"),
                          .rogue_client_key = path("rogue-node.key")};
}

}  // namespace tensord::testing
