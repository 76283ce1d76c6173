#include "server/metrics/metrics_text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/memory/device_names.h"

namespace tensord::server {
namespace {

// A label value: backslash, double quote and newline escaped, as the format asks.
std::string Label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void Family(std::string& out, const char* name, const char* type, const char* help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Sample(std::string& out, const char* name, uint64_t value, const std::string& labels = "") {
  absl::StrAppend(&out, name, labels.empty() ? "" : absl::StrCat("{", labels, "}"), " ", value, "\n");
}

// The node's part in its cluster; only where it is in one.
void AppendCluster(std::string& out, const tensord::v1::ClusterStatus& cluster) {
  Family(out, "tensord_cluster_joined", "gauge",
         "1 while this node's etcd lease is held (its names are in the cluster's directory), else 0.");
  absl::StrAppend(&out, "tensord_cluster_joined{node=\"", Label(cluster.node()), "\",etcd=\"",
                  Label(cluster.etcd_endpoint()), "\"} ", cluster.joined() ? 1 : 0, "\n");
  struct Figure {
    const char* name;
    const char* type;
    uint64_t value;
    const char* help;
  };
  const Figure figures[] = {
      {"tensord_cluster_names_recorded", "gauge", cluster.names_recorded(),
       "Names this node published that are in the cluster's directory."},
      {"tensord_cluster_replicas", "gauge", cluster.replicas(), "Names bound here as copies of other nodes' tensors."},
      {"tensord_cluster_reads_open", "gauge", cluster.reads_open(), "Other nodes' reads of tensors here, open now."},
      {"tensord_cluster_pulls_total", "counter", cluster.pulls(), "Transfers from other nodes that completed."},
      {"tensord_cluster_pulled_bytes_total", "counter", cluster.bytes_pulled(), "Bytes of those transfers."},
      {"tensord_cluster_pulls_failed_total", "counter", cluster.pulls_failed(),
       "Transfers from other nodes that failed (not those whose tensor went meanwhile)."},
      {"tensord_cluster_reads_served_total", "counter", cluster.reads_served(),
       "Reads of tensors here that other nodes completed."},
      {"tensord_cluster_served_bytes_total", "counter", cluster.bytes_served(), "Bytes of those reads."},
      {"tensord_cluster_device_copies_total", "counter", cluster.device_copies(),
       "Device tensors the staging helper copied to or from host memory."},
  };
  for (const Figure& figure : figures) {
    Family(out, figure.name, figure.type, figure.help);
    Sample(out, figure.name, figure.value);
  }
}

}  // namespace

std::string PrometheusText(const tensord::v1::StatusResponse& status, const RpcMetrics& rpcs,
                           const StartedWith& started) {
  std::string out;
  Family(out, "tensord_info", "gauge", "The daemon's version (always 1).");
  absl::StrAppend(&out, "tensord_info{version=\"", Label(status.version()), "\"} 1\n");
  Family(out, "tensord_uptime_seconds", "gauge", "Seconds since the daemon started.");
  absl::StrAppend(&out, "tensord_uptime_seconds ", absl::StrFormat("%.3f", status.uptime_ms() / 1e3), "\n");

  struct Gauge {
    const char* name;
    uint64_t value;
    const char* help;
  };
  const Gauge gauges[] = {
      {"tensord_tensors", status.tensors(), "Tensors the broker holds, named or not."},
      {"tensord_named_tensors", status.named_tensors(), "Names bound to a tensor."},
      {"tensord_buffers", status.buffers(), "Memory buffers (dedicated ones and arenas)."},
      {"tensord_leases", status.leases(), "Leases clients hold."},
      {"tensord_sessions", status.sessions(), "Connected clients (sessions)."},
      {"tensord_hand_overs_pending", status.hand_overs_pending(), "Hand-over tokens neither redeemed nor expired."},
      {"tensord_pooled_buffers", status.pooled_buffers(), "Recycled buffers waiting in producers' pools."},
      {"tensord_host_bytes_pooled", status.host_bytes_pooled(),
       "Host bytes in recycled buffers waiting in producers' pools (part of the host bytes in use)."},
  };
  for (const Gauge& gauge : gauges) {
    Family(out, gauge.name, "gauge", gauge.help);
    Sample(out, gauge.name, gauge.value);
  }
  Family(out, "tensord_leases_reclaimed_total", "counter",
         "Leases still held by clients when their sessions ended (exited or killed), released by the broker.");
  Sample(out, "tensord_leases_reclaimed_total", status.leases_reclaimed());
  Family(out, "tensord_releases_not_found_total", "counter", "Releases of leases the caller did not hold.");
  Sample(out, "tensord_releases_not_found_total", status.releases_not_found());

  Family(out, "tensord_device_bytes_in_use", "gauge", "Bytes of broker-owned and exported buffers, by device.");
  std::string limits, totals;
  for (const tensord::v1::BackendStatus& backend : status.backends()) {
    for (const tensord::v1::DeviceUsage& device : backend.devices()) {
      // The device key, as NamespaceUsage names devices ("host", "cuda:GPU-...").
      const std::string labels = absl::StrCat("backend=\"", Label(backend.name()), "\",device=\"",
                                              Label(common::DeviceKey(device.device())), "\"");
      Sample(out, "tensord_device_bytes_in_use", device.bytes_in_use(), labels);
      if (device.bytes_limit() != 0) Sample(limits, "tensord_device_bytes_limit", device.bytes_limit(), labels);
      if (device.total_bytes() != 0) Sample(totals, "tensord_device_bytes_total", device.total_bytes(), labels);
    }
  }
  Family(out, "tensord_device_bytes_limit", "gauge", "Quota by device (--max-host-bytes, --max-device-bytes).");
  out += limits;
  Family(out, "tensord_device_bytes_total", "gauge", "Memory of each device.");
  out += totals;

  Family(out, "tensord_namespace_tensors", "gauge", "Tensors by namespace and device.");
  std::string bytes;
  for (const tensord::v1::NamespaceUsage& ns : status.namespace_usage()) {
    const std::string labels = absl::StrCat("namespace=\"", Label(ns.namespace_()), "\",device=\"", Label(ns.device()), "\"");
    Sample(out, "tensord_namespace_tensors", ns.tensors(), labels);
    Sample(bytes, "tensord_namespace_bytes", ns.bytes(), labels);
  }
  Family(out, "tensord_namespace_bytes", "gauge",
         "Bytes of the tensors by namespace and device (their own bytes; an arena's free room is not counted).");
  out += bytes;

  Family(out, "tensord_restart_tensors_kept", "gauge",
         "Named tensors this daemon took over when it started, by where from (take-over, fd-store); 0: it started empty.");
  absl::StrAppend(&out, "tensord_restart_tensors_kept{from=\"", Label(started.from.empty() ? "none" : started.from),
                  "\"} ", started.tensors, "\n");
  Family(out, "tensord_restart_entries_refused", "gauge",
         "Entries of the state it was handed that this daemon refused at start (each logged with its reason).");
  absl::StrAppend(&out, "tensord_restart_entries_refused{from=\"", Label(started.from.empty() ? "none" : started.from),
                  "\"} ", started.refused, "\n");

  if (status.has_cluster()) AppendCluster(out, status.cluster());
  rpcs.AppendPrometheus(out);
  return out;
}

}  // namespace tensord::server
