#include "server/cluster/ucx_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tensord::server::cluster {
namespace {

absl::Status UcxError(const std::string& what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// The gets of one Read still outstanding, and the first error among them.
struct Pending {
  int outstanding = 0;
  ucs_status_t error = UCS_OK;
};

void OnGetDone(void* request, ucs_status_t status, void* user_data) {
  auto* pending = static_cast<Pending*>(user_data);
  --pending->outstanding;
  if (status != UCS_OK && pending->error == UCS_OK) pending->error = status;
  ucp_request_free(request);
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxNode>> UcxNode::Create() {
  std::unique_ptr<UcxNode> node(new UcxNode());
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) return UcxError("ucx: read config", s);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  ucs_status_t status = ucp_init(&params, config, &node->context_);
  ucp_config_release(config);
  if (status != UCS_OK) return UcxError("ucx: init", status);
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (status = ucp_worker_create(node->context_, &worker_params, &node->worker_); status != UCS_OK) {
    return UcxError("ucx: create a worker", status);
  }
  if (status = ucp_worker_get_efd(node->worker_, &node->event_fd_); status != UCS_OK) {
    return UcxError("ucx: the worker's event fd", status);
  }
  ucp_address_t* address = nullptr;
  size_t length = 0;
  if (status = ucp_worker_get_address(node->worker_, &address, &length); status != UCS_OK) {
    return UcxError("ucx: the worker's address", status);
  }
  node->address_.assign(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(node->worker_, address);
  return node;
}

UcxNode::~UcxNode() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

bool UcxNode::Progress() { return ucp_worker_progress(worker_) != 0; }

bool UcxNode::Arm() { return ucp_worker_arm(worker_) == UCS_OK; }

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxRegion::Register(UcxNode& node, void* base, size_t size) {
  std::unique_ptr<UcxRegion> region(new UcxRegion(node, base, size));
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = base;
  params.length = size;
  if (ucs_status_t s = ucp_mem_map(node.context(), &params, &region->memory_); s != UCS_OK) {
    return UcxError(absl::StrCat("ucx: register ", size, " bytes"), s);
  }
  void* key = nullptr;
  size_t key_size = 0;
  if (ucs_status_t s = ucp_rkey_pack(node.context(), region->memory_, &key, &key_size); s != UCS_OK) {
    return UcxError("ucx: pack a remote key", s);
  }
  region->packed_key_.assign(static_cast<const char*>(key), key_size);
  ucp_rkey_buffer_release(key);
  return region;
}

UcxRegion::~UcxRegion() {
  if (memory_ != nullptr) ucp_mem_unmap(node_.context(), memory_);
}

absl::StatusOr<std::unique_ptr<UcxEndpoint>> UcxEndpoint::Connect(UcxNode& node, std::string_view peer_address,
                                                                  std::string peer_name) {
  std::unique_ptr<UcxEndpoint> endpoint(new UcxEndpoint(node, std::move(peer_name)));
  ucp_ep_params_t params{};
  params.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  // A peer that dies fails the gets in flight instead of leaving them hanging.
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxEndpoint::OnError;
  params.err_handler.arg = endpoint.get();
  if (ucs_status_t s = ucp_ep_create(node.worker(), &params, &endpoint->endpoint_); s != UCS_OK) {
    return UcxError(absl::StrCat("ucx: connect to ", endpoint->peer_name_), s);
  }
  return endpoint;
}

void UcxEndpoint::OnError(void* self, ucp_ep_h, ucs_status_t status) {
  auto* endpoint = static_cast<UcxEndpoint*>(self);
  if (endpoint->error_ == UCS_OK) endpoint->error_ = status;
}

UcxEndpoint::~UcxEndpoint() { Close(); }

void UcxEndpoint::Close() {
  if (endpoint_ == nullptr) return;
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = error_ == UCS_OK ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(endpoint_, &params);
  endpoint_ = nullptr;
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (ucp_request_check_status(request) == UCS_INPROGRESS && absl::Now() < give_up) node_.Progress();
  ucp_request_free(request);
}

absl::Status UcxEndpoint::Read(void* local, size_t size, uint64_t remote_address, std::string_view packed_key,
                               const ReadOptions& options) {
  if (endpoint_ == nullptr || error_ != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("ucx: the connection to ", peer_name_, " is broken; connect again"));
  }
  ucp_rkey_h key = nullptr;
  if (ucs_status_t s = ucp_ep_rkey_unpack(endpoint_, packed_key.data(), &key); s != UCS_OK) {
    return UcxError(absl::StrCat("ucx: the remote key from ", peer_name_), s);
  }
  Pending pending;
  const size_t chunk = std::max<size_t>(options.chunk_bytes, 1);
  const int in_flight = std::max(options.in_flight, 1);
  const absl::Time deadline = absl::Now() + options.timeout;
  size_t issued = 0;
  absl::Status result = absl::OkStatus();
  while ((issued < size || pending.outstanding > 0) && result.ok()) {
    while (issued < size && pending.outstanding < in_flight) {
      const size_t length = std::min(chunk, size - issued);
      ucp_request_param_t params{};
      params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      params.cb.send = &OnGetDone;
      params.user_data = &pending;
      ucs_status_ptr_t request =
          ucp_get_nbx(endpoint_, static_cast<char*>(local) + issued, length, remote_address + issued, key, &params);
      if (UCS_PTR_IS_ERR(request)) {
        result = UcxError(absl::StrCat("ucx: read from ", peer_name_), UCS_PTR_STATUS(request));
        break;
      }
      if (request != nullptr) ++pending.outstanding;  // else done already, no callback
      issued += length;
    }
    node_.Progress();
    if (pending.error != UCS_OK) {
      result = UcxError(absl::StrCat("ucx: read from ", peer_name_), pending.error);
    } else if (error_ != UCS_OK) {
      result = UcxError(absl::StrCat("ucx: ", peer_name_, " went away"), error_);
    } else if (absl::Now() > deadline) {
      result = absl::DeadlineExceededError(absl::StrCat("ucx: read of ", size, " bytes from ", peer_name_,
                                                        " not done within ", absl::FormatDuration(options.timeout)));
    }
  }
  if (!result.ok()) {
    // No get may write into `local` after this returns: close the endpoint by force, which
    // completes what is outstanding, and wait for their callbacks.
    // `pending` lives on this stack, so the wait has no time limit: a forced close fails
    // every request of the endpoint.
    if (error_ == UCS_OK) error_ = UCS_ERR_CANCELED;
    Close();
    while (pending.outstanding > 0) node_.Progress();
  }
  ucp_rkey_destroy(key);
  return result;
}

}  // namespace tensord::server::cluster
