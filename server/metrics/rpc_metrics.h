// RpcMetrics: how many Broker requests of each method were answered with each status code,
// and how long they took, by how they came: a unary gRPC call or a request on a Session
// stream (where the client library sends most of its traffic). Recording is a clock read
// and a few relaxed atomic adds, since it sits on every request's path; the metrics
// endpoint renders the counts in Prometheus' text format. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace tensord::server {

enum class RpcMethod : uint8_t {
  kAllocate, kAcquire, kTake, kExport, kPublish, kRelease, kDelete, kList, kStat, kHandOver, kStatus, kCancelHandOvers,
  kCount  // not a method
};
enum class RpcTransport : uint8_t { kUnary, kSession, kCount };

const char* RpcMethodName(RpcMethod method);

class RpcMetrics {
 public:
  // Upper bounds of the latency histogram's buckets, in microseconds (+Inf follows).
  static constexpr std::array<uint64_t, 14> kBucketMicros = {50,    100,   250,    500,    1000,   2500,    5000,
                                                             10000, 25000, 50000, 100000, 250000, 1000000, 5000000};

 private:
  struct Series {
    std::array<std::atomic<uint64_t>, 17> by_code{};  // absl::StatusCode 0..16
    std::array<std::atomic<uint64_t>, kBucketMicros.size() + 1> buckets{};  // not cumulative
    std::atomic<uint64_t> sum_ns{0};
  };

 public:
  // One request in flight. Copyable, so a completion can carry it; Done once per request.
  class Timer {
   public:
    Timer() = default;  // records nothing (no metrics)
    void Done(absl::StatusCode code) const;

   private:
    friend class RpcMetrics;
    Timer(Series* series) : series_(series), start_(std::chrono::steady_clock::now()) {}
    Series* series_ = nullptr;
    std::chrono::steady_clock::time_point start_;
  };

  // A timer for `metrics`, or one that records nothing when it is null.
  static Timer Start(RpcMetrics* metrics, RpcMethod method, RpcTransport transport) {
    return metrics == nullptr ? Timer() : Timer(&metrics->series_[Index(method, transport)]);
  }

  // tensord_rpcs_total{method,transport,code} and tensord_rpc_duration_seconds{method,transport},
  // with their HELP and TYPE lines; series that never counted anything are left out.
  void AppendPrometheus(std::string& out) const;

 private:
  static size_t Index(RpcMethod method, RpcTransport transport) {
    return static_cast<size_t>(method) * static_cast<size_t>(RpcTransport::kCount) + static_cast<size_t>(transport);
  }
  std::array<Series, static_cast<size_t>(RpcMethod::kCount) * static_cast<size_t>(RpcTransport::kCount)> series_;
};

}  // namespace tensord::server
