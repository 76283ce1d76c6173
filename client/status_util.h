// Status translation at the client's edges: absl::Status (common/), grpc::Status (the
// channel) and RpcError (a Session-stream reply) become tensord::Status, the only error type
// the public API returns. The numeric codes are the canonical ones everywhere, so the
// translation keeps the code and the message. Thread-safe pure functions.
#pragma once

#include <exception>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "tensord/status.h"

namespace grpc {
class Status;
}  // namespace grpc

namespace tensord::v1 {
class RpcError;
}  // namespace tensord::v1

namespace tensord::internal {

Status FromAbsl(const absl::Status& status);
absl::Status ToAbsl(const Status& status);
Status FromGrpc(const grpc::Status& status);
// A unary Broker call's outcome, for the Session's absl results; FromAbsl of it is FromGrpc.
absl::Status AbslFromGrpc(const grpc::Status& status);
Status FromRpcError(const tensord::v1::RpcError& error);
// A canonical code from a peer: anything outside 1..16 becomes UNKNOWN.
StatusCode CodeFromInt(int code);

// The message with "<what>: " in front; the code is kept.
Status Annotate(const Status& status, std::string_view what);
absl::Status Annotate(const absl::Status& status, std::string_view what);

// What a std exception caught at the API boundary becomes (bad_alloc: RESOURCE_EXHAUSTED).
Status FromException(const std::exception& e, std::string_view what);

// Runs `fn` (returning Status or Result<T>) and turns any std exception it throws into a
// status, so nothing escapes the public API.
template <typename Fn>
auto Guard(std::string_view what, Fn&& fn) noexcept -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return FromException(e, what);
  } catch (...) {
    return Status(StatusCode::kInternal, std::string(what) + ": unknown exception");
  }
}

}  // namespace tensord::internal
