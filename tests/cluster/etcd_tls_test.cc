// EtcdClient over TLS against a real etcd that serves https only and asks every client for
// a certificate (--client-cert-auth): a node with a certificate of the cluster's CA is
// served; a client without one, with one of another CA, or trusting another CA than the one
// that signed etcd's is refused, and the error names etcd.
#include <filesystem>
#include <optional>

#include "gtest/gtest.h"
#include "server/cluster/etcd_client.h"
#include "tests/cluster/etcd_server.h"
#include "tests/cluster/test_certs.h"

namespace tensord::server::cluster {
namespace {

using ::tensord::testing::EtcdServer;
using ::tensord::testing::MakeTestCertificates;
using ::tensord::testing::TestCertificates;

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdServer::Binary().empty()) {
      GTEST_SKIP() << "no etcd binary was found at configure time (Debian: etcd-server, which "
                      "deploy/install-deps.sh installs)";
    }
    char dir[] = "/tmp/tensord-certs-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    absl::StatusOr<TestCertificates> certs = MakeTestCertificates(dir_);
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
    absl::StatusOr<EtcdServer> server = EtcdServer::Start(certs_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_.emplace(std::move(*server));
  }
  void TearDown() override {
    server_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A put with these options must be refused; returns why.
  absl::Status Refused(const EtcdOptions& options) {
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
    if (!client.ok()) return client.status();
    absl::StatusOr<int64_t> put = (*client)->Put("tensord/tls", "x");
    EXPECT_FALSE(put.ok()) << "etcd served a client it should have refused";
    return put.status();
  }

  std::string dir_;
  TestCertificates certs_;
  std::optional<EtcdServer> server_;
};

TEST_F(EtcdTlsTest, ANodeWithTheClustersCertificateIsServed) {
  EXPECT_EQ(server_->endpoint().rfind("https://", 0), 0u) << server_->endpoint();
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(server_->ClientOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Put("tensord/tls", "secret").ok());
  absl::StatusOr<std::optional<EtcdKeyValue>> got = (*client)->Get("tensord/tls");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "secret");
}

TEST_F(EtcdTlsTest, AClientWithoutACertificateIsRefused) {
  EtcdOptions options = server_->ClientOptions();
  options.cert_file.clear();
  options.key_file.clear();
  absl::Status why = Refused(options);
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable) << why;
  EXPECT_NE(why.message().find("etcd at " + server_->endpoint()), std::string_view::npos) << why;
}

TEST_F(EtcdTlsTest, AClientWithAnotherCasCertificateIsRefused) {
  EtcdOptions options = server_->ClientOptions();
  options.cert_file = certs_.rogue_client_cert;
  options.key_file = certs_.rogue_client_key;
  EXPECT_EQ(Refused(options).code(), absl::StatusCode::kUnavailable);
}

TEST_F(EtcdTlsTest, AnEtcdNotSignedByTheTrustedCaIsRefused) {
  EtcdOptions options = server_->ClientOptions();
  options.ca_file = certs_.rogue_ca;
  EXPECT_EQ(Refused(options).code(), absl::StatusCode::kUnavailable);
}

TEST_F(EtcdTlsTest, APlainClientIsRefused) {
  EtcdOptions options{.endpoints = {"http://" + server_->endpoint().substr(sizeof("https://") - 1)},
                      .call_timeout = absl::Seconds(2)};
  EXPECT_FALSE(Refused(options).ok());
}

TEST(EtcdTlsOptionsTest, TlsSettingsAreChecked) {
  auto create = [](EtcdOptions options) { return EtcdClient::Create(std::move(options)).status(); };
  EXPECT_EQ(create({.endpoints = {"https://127.0.0.1:2379"}}).code(), absl::StatusCode::kInvalidArgument);
  absl::Status missing = create({.endpoints = {"https://127.0.0.1:2379"}, .ca_file = "/nonexistent/ca.crt"});
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("/nonexistent/ca.crt"), std::string_view::npos) << missing;
  EXPECT_EQ(create({.endpoints = {"https://127.0.0.1:2379"}, .ca_file = "/etc/hostname"}).code(),
            absl::StatusCode::kInvalidArgument);  // not PEM
  EXPECT_EQ(create({.endpoints = {"https://127.0.0.1:2379"}, .ca_file = "/x", .cert_file = "/y"}).code(),
            absl::StatusCode::kInvalidArgument);  // a certificate without its key
  EXPECT_EQ(create({.endpoints = {"http://127.0.0.1:2379"}, .ca_file = "/x"}).code(),
            absl::StatusCode::kInvalidArgument);  // TLS files for plain endpoints
  EXPECT_EQ(create({.endpoints = {"http://127.0.0.1:1", "https://127.0.0.1:2"}}).code(),
            absl::StatusCode::kInvalidArgument);  // mixed schemes
  EXPECT_EQ(create({.endpoints = {"http://127.0.0.1:1", "http://127.0.0.1:2"}}).code(),
            absl::StatusCode::kOk);  // several members (etcd_members_test.cc)
}

}  // namespace
}  // namespace tensord::server::cluster
