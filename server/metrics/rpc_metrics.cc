#include "server/metrics/rpc_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tensord::server {

const char* RpcMethodName(RpcMethod method) {
  switch (method) {
    case RpcMethod::kAllocate: return "Allocate";
    case RpcMethod::kAcquire: return "Acquire";
    case RpcMethod::kTake: return "Take";
    case RpcMethod::kExport: return "Export";
    case RpcMethod::kPublish: return "Publish";
    case RpcMethod::kRelease: return "Release";
    case RpcMethod::kDelete: return "Delete";
    case RpcMethod::kList: return "List";
    case RpcMethod::kStat: return "Stat";
    case RpcMethod::kHandOver: return "HandOver";
    case RpcMethod::kStatus: return "Status";
    case RpcMethod::kCancelHandOvers: return "CancelHandOvers";
    case RpcMethod::kCount: break;
  }
  return "unknown";
}

void RpcMetrics::Timer::Done(absl::StatusCode code) const {
  if (series_ == nullptr) return;
  const uint64_t ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count());
  const size_t code_index = std::min<size_t>(static_cast<size_t>(code), series_->by_code.size() - 1);
  series_->by_code[code_index].fetch_add(1, std::memory_order_relaxed);
  const uint64_t micros = ns / 1000;
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(kBucketMicros.begin(), kBucketMicros.end(), micros) - kBucketMicros.begin());
  series_->buckets[bucket].fetch_add(1, std::memory_order_relaxed);
  series_->sum_ns.fetch_add(ns, std::memory_order_relaxed);
}

void RpcMetrics::AppendPrometheus(std::string& out) const {
  std::string counts, durations;
  for (size_t m = 0; m < static_cast<size_t>(RpcMethod::kCount); ++m) {
    for (size_t t = 0; t < static_cast<size_t>(RpcTransport::kCount); ++t) {
      const Series& series = series_[Index(static_cast<RpcMethod>(m), static_cast<RpcTransport>(t))];
      const std::string labels = absl::StrCat("method=\"", RpcMethodName(static_cast<RpcMethod>(m)),
                                              "\",transport=\"", t == 0 ? "unary" : "session", "\"");
      uint64_t total = 0;
      for (size_t c = 0; c < series.by_code.size(); ++c) {
        const uint64_t n = series.by_code[c].load(std::memory_order_relaxed);
        if (n == 0) continue;
        total += n;
        absl::StrAppend(&counts, "tensord_rpcs_total{", labels, ",code=\"",
                        absl::StatusCodeToString(static_cast<absl::StatusCode>(c)), "\"} ", n, "\n");
      }
      if (total == 0) continue;
      // Buckets are read one by one while requests go on: the cumulative counts are made
      // from one read of each, and the count is their sum, so the histogram stays consistent.
      uint64_t cumulative = 0;
      for (size_t b = 0; b < series.buckets.size(); ++b) {
        cumulative += series.buckets[b].load(std::memory_order_relaxed);
        const std::string le = b < kBucketMicros.size() ? absl::StrFormat("%g", kBucketMicros[b] / 1e6) : "+Inf";
        absl::StrAppend(&durations, "tensord_rpc_duration_seconds_bucket{", labels, ",le=\"", le, "\"} ", cumulative,
                        "\n");
      }
      absl::StrAppend(&durations, "tensord_rpc_duration_seconds_sum{", labels, "} ",
                      absl::StrFormat("%.9f", series.sum_ns.load(std::memory_order_relaxed) / 1e9), "\n");
      absl::StrAppend(&durations, "tensord_rpc_duration_seconds_count{", labels, "} ", cumulative, "\n");
    }
  }
  absl::StrAppend(&out, "# HELP tensord_rpcs_total Broker requests answered, by method, transport and status code.\n",
                  "# TYPE tensord_rpcs_total counter\n", counts,
                  "# HELP tensord_rpc_duration_seconds Time from a Broker request's arrival to its answer "
                  "(waits included).\n",
                  "# TYPE tensord_rpc_duration_seconds histogram\n", durations);
}

}  // namespace tensord::server
