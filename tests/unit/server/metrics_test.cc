// The metrics endpoint's parts: its address syntax, the RPC histograms, and the text format.
// tests/service/test_metrics.py scrapes a running daemon.
#include "gtest/gtest.h"
#include "server/metrics/metrics_text.h"
#include "server/metrics/rpc_metrics.h"
#include "server/transport/metrics_endpoint.h"

namespace tensord::server {
namespace {

TEST(MetricsAddressTest, HostPortAndUnixPaths) {
  auto v4 = ParseMetricsAddress("127.0.0.1:9464");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 9464);
  auto v6 = ParseMetricsAddress("[::1]:0");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
  auto any = ParseMetricsAddress(":9464");
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->host, "");
  auto unix_path = ParseMetricsAddress("unix:/run/tensord/metrics.sock");
  ASSERT_TRUE(unix_path.ok());
  EXPECT_EQ(unix_path->unix_path, "/run/tensord/metrics.sock");
}

TEST(MetricsAddressTest, MalformedAddressesSayWhy) {
  EXPECT_NE(ParseMetricsAddress("9464").status().message().find("HOST:PORT"), std::string::npos);
  EXPECT_NE(ParseMetricsAddress("localhost:http").status().message().find("'http' is not a number"),
            std::string::npos);
  EXPECT_NE(ParseMetricsAddress("localhost:65536").status().message().find("0 to 65535"), std::string::npos);
  EXPECT_NE(ParseMetricsAddress("::1:9464").status().message().find("brackets"), std::string::npos);
  EXPECT_NE(ParseMetricsAddress("unix:").status().message().find("needs a path"), std::string::npos);
  EXPECT_FALSE(ParseMetricsAddress("host:-1").ok());
}

bool Contains(const std::string& text, const std::string& line) { return text.find(line) != std::string::npos; }

TEST(RpcMetricsTest, CountsByCodeAndCumulativeBuckets) {
  RpcMetrics metrics;
  RpcMetrics::Start(&metrics, RpcMethod::kAcquire, RpcTransport::kSession).Done(absl::StatusCode::kOk);
  RpcMetrics::Start(&metrics, RpcMethod::kAcquire, RpcTransport::kSession).Done(absl::StatusCode::kOk);
  RpcMetrics::Start(&metrics, RpcMethod::kAcquire, RpcTransport::kSession).Done(absl::StatusCode::kNotFound);
  RpcMetrics::Start(nullptr, RpcMethod::kStat, RpcTransport::kUnary).Done(absl::StatusCode::kOk);  // no metrics
  std::string text;
  metrics.AppendPrometheus(text);
  EXPECT_TRUE(Contains(text, "tensord_rpcs_total{method=\"Acquire\",transport=\"session\",code=\"OK\"} 2\n")) << text;
  EXPECT_TRUE(Contains(text, "tensord_rpcs_total{method=\"Acquire\",transport=\"session\",code=\"NOT_FOUND\"} 1\n"));
  EXPECT_TRUE(Contains(text, "tensord_rpc_duration_seconds_bucket{method=\"Acquire\",transport=\"session\",le=\"+Inf\"} 3\n"));
  EXPECT_TRUE(Contains(text, "tensord_rpc_duration_seconds_count{method=\"Acquire\",transport=\"session\"} 3\n"));
  EXPECT_FALSE(Contains(text, "method=\"Stat\""));  // series that counted nothing are left out
  EXPECT_TRUE(Contains(text, "# TYPE tensord_rpc_duration_seconds histogram\n"));
}

TEST(MetricsTextTest, LabelsAreEscapedAndEveryFamilyIsTyped) {
  tensord::v1::StatusResponse status;
  status.set_version("1.2.3");
  status.set_tensors(7);
  status.set_leases_reclaimed(5);
  tensord::v1::NamespaceUsage* ns = status.add_namespace_usage();
  ns->set_namespace_("we\"ird\\ns");
  ns->set_device("host");
  ns->set_tensors(2);
  ns->set_bytes(128);
  // A node of a cluster: its section, typed like the rest.
  tensord::v1::ClusterStatus* cluster = status.mutable_cluster();
  cluster->set_node("node-a");
  cluster->set_etcd_endpoint("https://10.0.0.2:2379");
  cluster->set_joined(true);
  cluster->set_pulls(3);
  cluster->set_bytes_served(4096);
  cluster->set_device_copies(2);
  RpcMetrics rpcs;
  const std::string text = PrometheusText(status, rpcs);
  EXPECT_TRUE(Contains(text, "tensord_cluster_joined{node=\"node-a\",etcd=\"https://10.0.0.2:2379\"} 1\n")) << text;
  EXPECT_TRUE(Contains(text, "tensord_cluster_pulls_total 3\n")) << text;
  EXPECT_TRUE(Contains(text, "tensord_cluster_served_bytes_total 4096\n")) << text;
  EXPECT_TRUE(Contains(text, "tensord_cluster_device_copies_total 2\n")) << text;
  EXPECT_TRUE(Contains(text, "tensord_tensors 7\n"));
  EXPECT_TRUE(Contains(text, "tensord_leases_reclaimed_total 5\n"));
  EXPECT_TRUE(Contains(text, "tensord_namespace_bytes{namespace=\"we\\\"ird\\\\ns\",device=\"host\"} 128\n")) << text;
  EXPECT_TRUE(Contains(text, "tensord_info{version=\"1.2.3\"} 1\n"));
  // Every sample's family was declared with a TYPE line before it.
  std::string declared;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.rfind("# TYPE ", 0) == 0) {
      declared += " " + line.substr(7, line.find(' ', 7) - 7) + " ";
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          declared.find(" " + name.substr(0, name.size() - s.size()) + " ") != std::string::npos) {
        name = name.substr(0, name.size() - s.size());
      }
    }
    EXPECT_NE(declared.find(" " + name + " "), std::string::npos) << line;
  }
  // A daemon in no cluster has no cluster families at all.
  status.clear_cluster();
  EXPECT_FALSE(Contains(PrometheusText(status, rpcs), "tensord_cluster_")) << "a node in no cluster";
}

}  // namespace
}  // namespace tensord::server
