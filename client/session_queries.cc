// Session's unary Broker calls, each its own gRPC call beside the Session stream: hand-overs
// cancelled, Delete, a page of List, Stat, Status, and Watch streams (watcher.h).
#include <algorithm>
#include <string>
#include <utility>

#include "client/session.h"
#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "client/watcher.h"
#include "common/protocol_limits.h"
#include "common/status.h"

namespace tensord::internal {

absl::StatusOr<CancelledHandOvers> Session::CancelHandOvers(const std::vector<std::string>& tokens) {
  tensord::v1::CancelHandOversRequest request;
  request.mutable_tokens()->Assign(tokens.begin(), tokens.end());
  tensord::v1::CancelHandOversResponse response;
  {
    TENSORD_ASSIGN_OR_RETURN(RpcCall call, BeginCall());
    TENSORD_RETURN_IF_ERROR(AbslFromGrpc(call.stub()->CancelHandOvers(call.context(), request, &response)));
  }
  return CancelledHandOvers{response.cancelled(), response.not_found()};
}

absl::Status Session::Delete(std::string_view name, uint64_t if_generation) {
  tensord::v1::DeleteRequest request;
  request.set_name(std::string(name));
  request.set_if_generation(if_generation);
  tensord::v1::DeleteResponse response;
  grpc::Status status;
  {
    TENSORD_ASSIGN_OR_RETURN(RpcCall call, BeginCall());
    status = call.stub()->Delete(call.context(), request, &response);
  }
  // Whatever the outcome, a cached lease of the name must ask the broker again.
  ForgetName(name);
  return AbslFromGrpc(status);
}

absl::StatusOr<TensorPage> Session::ListPage(std::string_view prefix, const ListPageOptions& options) {
  tensord::v1::ListRequest request;
  request.set_prefix(std::string(prefix));
  request.set_page_token(options.page_token);
  // Never 0, which asks the broker for an unpaged answer.
  request.set_page_size(static_cast<uint32_t>(
      options.limit == 0 ? common::kMaxListPageEntries : std::min(options.limit, common::kMaxListPageEntries)));
  tensord::v1::ListResponse response;
  {
    TENSORD_ASSIGN_OR_RETURN(RpcCall call, BeginCall());
    TENSORD_RETURN_IF_ERROR(AbslFromGrpc(call.stub()->List(call.context(), request, &response)));
  }
  TensorPage page;
  page.tensors.reserve(static_cast<size_t>(response.tensors_size()));
  for (const tensord::v1::TensorInfo& t : response.tensors()) {
    TENSORD_ASSIGN_OR_RETURN(ValidatedTensor valid, ValidateTensorInfo(t, "list entry '" + t.name() + "'"));
    page.tensors.push_back(std::move(valid.info));
  }
  page.next_page_token = std::move(*response.mutable_next_page_token());
  // A page that would not move the listing on would make List go round forever.
  if (!page.next_page_token.empty() &&
      (page.tensors.empty() || page.next_page_token <= options.page_token)) {
    return absl::DataLossError("list '" + std::string(prefix) + "': the broker's page after '" +
                               options.page_token + "' does not move the listing on");
  }
  return page;
}

absl::StatusOr<TensorStat> Session::Stat(const Target& target) {
  tensord::v1::StatRequest request;
  if (const std::string* name = std::get_if<std::string>(&target)) {
    request.set_name(*name);
  } else {
    request.set_tensor_id(std::get<uint64_t>(target));
  }
  tensord::v1::StatResponse response;
  {
    TENSORD_ASSIGN_OR_RETURN(RpcCall call, BeginCall());
    TENSORD_RETURN_IF_ERROR(AbslFromGrpc(call.stub()->Stat(call.context(), request, &response)));
  }
  TENSORD_ASSIGN_OR_RETURN(ValidatedTensor valid, ValidateTensorInfo(response.tensor(), "stat"));
  TensorStat out;
  out.info = std::move(valid.info);
  for (const tensord::v1::LeaseHolder& h : response.holders()) {
    out.holders.push_back(ToPublicHolder(h));
  }
  return out;
}

absl::StatusOr<BrokerStatus> Session::GetStatus(const StatusOptions& options) {
  tensord::v1::StatusRequest request;
  request.set_include_sessions(options.sessions);
  request.set_include_queues(options.queues);
  tensord::v1::StatusResponse response;
  {
    TENSORD_ASSIGN_OR_RETURN(RpcCall call, BeginCall());
    TENSORD_RETURN_IF_ERROR(AbslFromGrpc(call.stub()->Status(call.context(), request, &response)));
  }
  return ToPublicStatus(response);
}

absl::StatusOr<std::unique_ptr<Watcher>> Session::Watch(std::string_view prefix, bool initial) {
  return WatcherImpl::Start(shared_from_this(), prefix, initial);
}

}  // namespace tensord::internal
