#include "client/status_util.h"

#include <new>

#include "grpcpp/support/status.h"
#include "tensord/v1/broker.pb.h"

namespace tensord::internal {

StatusCode CodeFromInt(int code) {
  if (code < 0 || code > static_cast<int>(StatusCode::kUnauthenticated)) {
    return StatusCode::kUnknown;
  }
  return static_cast<StatusCode>(code);
}

Status FromAbsl(const absl::Status& status) {
  if (status.ok()) return Status();
  return Status(CodeFromInt(static_cast<int>(status.code())), std::string(status.message()));
}

absl::Status ToAbsl(const Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.code()), status.message());
}

Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return Status();
  return Status(CodeFromInt(static_cast<int>(status.error_code())), status.error_message());
}

absl::Status AbslFromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const StatusCode code = CodeFromInt(static_cast<int>(status.error_code()));
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

Status FromRpcError(const tensord::v1::RpcError& error) {
  StatusCode code = CodeFromInt(error.code());
  // An error reply that says OK is the broker's bug; never let it look like success.
  if (code == StatusCode::kOk) code = StatusCode::kUnknown;
  return Status(code, error.message());
}

Status Annotate(const Status& status, std::string_view what) {
  if (status.ok()) return status;
  return Status(status.code(), std::string(what) + ": " + status.message());
}

absl::Status Annotate(const absl::Status& status, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), std::string(what) + ": " + std::string(status.message()));
}

Status FromException(const std::exception& e, std::string_view what) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return Status(StatusCode::kResourceExhausted, std::string(what) + ": out of memory");
  }
  return Status(StatusCode::kInternal, std::string(what) + ": " + e.what());
}

}  // namespace tensord::internal
