// Session's exports of memory the producer already has: a memfd (the host backend adopts
// it) or device memory at a pointer (the device's importer makes a handle the backend
// adopts). The producer's own view is what it had; the broker's handle is never fetched.
#include <string>
#include <utility>

#include "client/session.h"
#include "client/status_util.h"
#include "client/tensor_convert.h"
#include "common/memory/backends.h"
#include "common/memory/host/memfd.h"
#include "common/status.h"

namespace tensord::internal {

absl::StatusOr<LeaseView*> Session::Export(int memfd, uint64_t offset, std::string_view ns,
                                           const TensorSpec& spec) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const std::string what = "export into '" + std::string(ns) + "'";
  absl::StatusOr<tensord::v1::TensorDesc> desc = SpecToDesc(spec);
  if (!desc.ok()) return Annotate(desc.status(), what);
  absl::StatusOr<uint64_t> size = common::PrepareExportedMemfd(memfd, what);
  if (!size.ok()) return size.status();
  absl::StatusOr<uint64_t> staged = fd_->Stage(memfd);
  if (!staged.ok()) return Annotate(staged.status(), what);
  tensord::v1::ExportRequest request;
  request.set_staged_fd_id(*staged);
  request.set_offset(offset);
  OwnMemory own;
  own.memfd = memfd;
  return RegisterExport(std::move(request), ns, *std::move(desc), spec, own, what);
}

absl::StatusOr<LeaseView*> Session::ExportDevice(const void* device_ptr, std::string_view ns,
                                                 const TensorSpec& spec, std::shared_ptr<const void> source) {
  TENSORD_RETURN_IF_ERROR(CheckOpen());
  const std::string what = "export device memory into '" + std::string(ns) + "'";
  // Names the device by its UUID too: the handle carries it, the broker resolves it.
  absl::StatusOr<tensord::v1::TensorDesc> desc = SpecToDesc(spec);
  if (!desc.ok()) return Annotate(desc.status(), what);
  TENSORD_ASSIGN_OR_RETURN(common::TensorLayout layout, common::ValidateDesc(*desc));
  if (layout.extent == 0) {
    return absl::InvalidArgumentError(what + ": a tensor of no elements has no memory to export");
  }
  absl::StatusOr<common::Importer*> importer = common::ProcessImporters().For(desc->device().type());
  if (!importer.ok()) return Annotate(importer.status(), what);
  // The buffer the handle names starts at `device_ptr` and holds the tensor's extent; the
  // tensor is at its start.
  TENSORD_ASSIGN_OR_RETURN(common::MemoryHandle handle,
                           (*importer)->ExportExisting(device_ptr, layout.extent, desc->device(), what));
  // The handle's fd (Level Zero: the allocation's dma-buf) goes ahead on the fd channel.
  if (handle.fds.size() > 1) {
    return absl::UnimplementedError(what + ": a device handle with " + std::to_string(handle.fds.size()) +
                                    " fds is not exported (one per allocation is)");
  }
  tensord::v1::ExportRequest request;
  if (handle.fds.size() == 1) {
    absl::StatusOr<uint64_t> staged = fd_->Stage(handle.fds[0].get());
    if (!staged.ok()) return Annotate(staged.status(), what);
    request.set_staged_fd_id(*staged);
  }
  request.set_handle_data(std::move(handle.data));
  request.set_size(layout.extent);
  request.set_offset(0);
  OwnMemory own;
  own.mapping = std::make_shared<Mapping>(std::make_unique<common::BorrowedRegion>(
      const_cast<void*>(device_ptr), layout.extent, common::MapMode::kSharedWritable, spec.device.device_id,
      (*importer)->stream_order(), source));
  // The broker cannot keep this memory alive: the session keeps `source` until the broker
  // says no one holds the export any more, however early the caller drops its view.
  return RegisterExport(std::move(request), ns, *std::move(desc), spec, own, what, std::move(source));
}

absl::StatusOr<LeaseView*> Session::RegisterExport(tensord::v1::ExportRequest request, std::string_view ns,
                                                   tensord::v1::TensorDesc desc, const TensorSpec& spec,
                                                   const OwnMemory& own, const std::string& what,
                                                   ExportTable::Source source) {
  request.set_ns(std::string(ns));
  *request.mutable_desc() = std::move(desc);
  request.mutable_tags()->insert(spec.tags.begin(), spec.tags.end());
  tensord::v1::AllocateResponse response;
  {
    TENSORD_ASSIGN_OR_RETURN(RpcCall call, BeginCall());
    grpc::Status status = call.stub()->Export(call.context(), request, &response);
    if (!status.ok()) return ToAbsl(FromGrpc(status));
  }
  // Before the producer's lease can go (AdoptLease gives it back on failure): the notice
  // comes only after that.
  if (source != nullptr) {
    exports_.Add(response.tensor().tensor_id(), response.tensor().buffer().buffer_id(), std::move(source));
  }
  return adopter_.AdoptLease(response.lease_id(), response.tensor(), {}, ViewKind::kProducer, "", what, own);
}

ReleaseSink::Clock::time_point Session::TickExports(Clock::time_point now) {
  const bool over = channel_.dead() || channel_.closing();
  if (!over && exports_.TakeUnsure()) ReconcileExports();
  // Dropped here, on the sender thread and under no lock: a source may be user code.
  exports_.TakeReleased().clear();
  // A session that is over leaves what is held to its owner (SessionHolder).
  if (over || exports_.held() == 0) return Clock::time_point::max();
  // A notice comes only down a stream: keep one open (a fork or a broken stream closes it,
  // and nothing else may reopen it soon). One that missed pushes starts with a cache_reset.
  channel_.KeepStreamOpen();
  return now + kExportStreamCheck;
}

void Session::ReconcileExports() {
  for (uint64_t tensor_id : exports_.HeldTensorIds()) {
    absl::StatusOr<RpcCall> call = BeginCall(std::chrono::seconds(5));
    if (!call.ok()) {
      exports_.MarkUnsure();  // asked again on a later tick
      return;
    }
    tensord::v1::StatRequest request;
    request.set_tensor_id(tensor_id);
    tensord::v1::StatResponse response;
    grpc::Status status = call->stub()->Stat(call->context(), request, &response);
    // The producer may always read its own tensor: NOT_FOUND means the broker freed it.
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      exports_.Release(tensor_id);
    } else if (!status.ok()) {
      exports_.MarkUnsure();
      return;
    }
  }
}

}  // namespace tensord::internal
