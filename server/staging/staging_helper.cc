// tensord-stage: the daemon's staging helper (server/cluster/device_stager.h). It copies a
// device tensor to host memory or back, one request at a time, on the socket the daemon
// passed it, and exits when the daemon closes that socket or exits. It imports buffers
// through the importer of their device type, as a client does, and copies through that
// kind's stream order (common/memory/stream_order.h); the device context is made here, on
// the first copy, never in the daemon.
//
// Usage (the daemon runs it): tensord-stage FD
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/memory/backends.h"
#include "common/memory/host/mapped_region.h"
#include "common/memory/importer.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "tensord/cluster/v1/staging.pb.h"

namespace tensord::staging {
namespace {

namespace cv1 = tensord::cluster::v1;

absl::Status Stage(const cv1::StageRequest& request, std::vector<common::UniqueFd> fds) {
  const std::string& what = request.what();
  const bool to_host = request.direction() == cv1::StageRequest::TO_HOST;
  if (!to_host && request.direction() != cv1::StageRequest::TO_DEVICE) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no direction to stage in"));
  }
  if (fds.size() != 1 + static_cast<size_t>(request.handle_fds())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", fds.size(), " fds came, not the host memfd and ", request.handle_fds()));
  }
  if (request.nbytes() == 0 || request.offset() + request.nbytes() > request.buffer_size() ||
      request.offset() + request.nbytes() < request.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", request.nbytes(), " bytes at ", request.offset(),
                                                   " do not fit a buffer of ", request.buffer_size()));
  }
  TENSORD_ASSIGN_OR_RETURN(common::Importer * importer, common::ProcessImporters().For(request.device_type()));
  common::FetchedBuffer buffer;
  buffer.size = request.buffer_size();
  buffer.device_type = request.device_type();
  buffer.handle.data = request.handle();
  for (size_t i = 1; i < fds.size(); ++i) buffer.handle.fds.push_back(std::move(fds[i]));
  TENSORD_ASSIGN_OR_RETURN(
      std::unique_ptr<common::ImportedRegion> device,
      importer->Import(buffer, to_host ? common::MapMode::kSharedReadOnly : common::MapMode::kSharedWritable, what));
  const common::StreamOrder* order = device->stream_order();
  if (order == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": host memory needs no staging"));
  }
  TENSORD_ASSIGN_OR_RETURN(
      common::MappedRegion host,
      common::MappedRegion::Map(fds[0].get(), request.nbytes(),
                                to_host ? common::MapMode::kSharedWritable : common::MapMode::kSharedReadOnly,
                                absl::StrCat(what, " (host copy)")));
  uint8_t* at = device->data() + request.offset();
  const int32_t ordinal = device->device_ordinal();
  if (!to_host) return order->CopyFromHost(at, host.data(), request.nbytes(), ordinal, what);
  if (!request.ready_fence().empty()) {
    TENSORD_RETURN_IF_ERROR(order->WaitReadyOnHost(common::ReadyFence{request.ready_fence(), ""}, ordinal, what));
  }
  return order->CopyToHost(host.data(), at, request.nbytes(), ordinal, what);
}

int Serve(int socket) {
  for (;;) {
    absl::StatusOr<common::ReceivedMessage> received = common::ReceiveFdMessage(socket, common::kMaxFdsPerMessage);
    if (!received.ok()) {
      if (received.status().code() == absl::StatusCode::kUnavailable) return 0;  // the daemon closed it
      spdlog::error("tensord-stage: {}", std::string(received.status().message()));
      return 1;
    }
    cv1::StageRequest request;
    absl::Status status = common::ParseFdMessage(*received, &request);
    if (status.ok()) status = Stage(request, std::move(received->fds));
    cv1::StageReply reply;
    reply.set_code(static_cast<int32_t>(status.code()));
    reply.set_message(std::string(status.message()));
    if (reply.message().empty()) reply.set_message("done");  // never a zero-byte datagram
    if (absl::StatusOr<common::FdIo> sent = common::SendFdMessage(socket, reply); !sent.ok()) return 0;
  }
}

}  // namespace
}  // namespace tensord::staging

int main(int argc, char** argv) {
  int socket = -1;
  if (argc != 2 || !absl::SimpleAtoi(argv[1], &socket) || socket < 0) {
    spdlog::error("usage: tensord-stage FD (the daemon starts it; it is not for running by hand)");
    return 2;
  }
  // The daemon's end of the socket closes when it exits, however it exits: the next read
  // here then ends the helper. (Not PR_SET_PDEATHSIG: that fires when the daemon thread
  // that started the helper ends, which an RPC thread may do at any time.)
  ::signal(SIGPIPE, SIG_IGN);
  return tensord::staging::Serve(socket);
}
