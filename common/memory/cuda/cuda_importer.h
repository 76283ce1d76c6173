// CudaImporter: the client half of the cuda memory kind. Turns a cuda buffer's handle
// (cuda_handle.h) into device memory mapped in this process.
//
// The handle names its device by UUID; the importer finds this process's ordinal for it
// (CUDA_VISIBLE_DEVICES may renumber or hide devices), FAILED_PRECONDITION "device GPU-...
// is not visible in this process (CUDA_VISIBLE_DEVICES=...)" when it has none.
//
// VMM fd: cuMemImportFromShareableHandle(fd), cuMemAddressReserve (the device's
// granularity as alignment), cuMemMap of the whole allocation, cuMemSetAccess for that
// device. The region's destructor undoes it: cuMemUnmap, cuMemRelease, cuMemAddressFree.
// None of these needs a current context (cuda_driver.h), so importing makes none. The
// fd may be closed once Import returns: the imported handle holds the allocation.
//
// Access by mode: kSharedWritable (the producer) and kPrivate map read-write. Device
// memory has no copy-on-write, so kPrivate is a shared read-write mapping: a consumer that
// writes changes what everyone reads (the client must say so; DLPack cannot mark it).
// kSharedReadOnly asks for CU_MEM_ACCESS_FLAGS_PROT_READ, which cuda.h defines for
// cuMemSetAccess; if the driver refuses it, the region maps read-write instead, says so in
// access_enforced(), and the refusal is logged once per process: read-only is then only the
// DLPack flag. Which drivers accept PROT_READ on a device's own memory is not verified on
// hardware here.
//
// Exports (ExportExisting): a legacy IPC handle of memory this process already has, for
// the broker to adopt; see the method.
//
// Legacy IPC: cuIpcOpenMemHandle(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) in the device's
// primary context, plus the handle's offset; cuIpcCloseMemHandle when the last region of
// that allocation goes. A process may open one allocation only once (older drivers answer
// CUDA_ERROR_ALREADY_MAPPED to a second open), so opens are cached per (uuid, IPC handle)
// with a refcount; the cache outlives the importer while any region uses it. The memory
// is the producer's: it must outlive every region, which the broker's policy guarantees
// (producer death retires the tensor), not this class. Legacy IPC cannot be read-only:
// access_enforced() is false for kSharedReadOnly.
//
// Errors: INVALID_ARGUMENT for a malformed handle or a wrong fd count, DATA_LOSS when the
// handle backs fewer bytes than the buffer, FAILED_PRECONDITION for an invisible device,
// UNAVAILABLE when the driver is, the driver's error otherwise; messages name `what`.
//
// Thread-safe. A region's destructor takes only the IPC cache's own lock (legacy IPC) and
// never throws; driver failures there are logged.
#pragma once

#include <cuda.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/memory/cuda/cuda_driver.h"
#include "common/memory/importer.h"

namespace tensord::common {

// A region on a CUDA device.
class CudaRegion : public ImportedRegion {
 public:
  // This process's ordinal of the region's device (the CUdevice; cuDeviceGet(&d, n) gives
  // n): the client's DLDevice{kDLCUDA, device_ordinal()}.
  int32_t device_ordinal() const override = 0;
  // False when mode() is kSharedReadOnly but the memory is mapped writable (see above).
  virtual bool access_enforced() const = 0;
};

class CudaImporter final : public Importer {
 public:
  // Uses the process's driver (CudaDriver::Get(), loaded on the first Import).
  CudaImporter();
  // For tests: a driver that outlives every region.
  explicit CudaImporter(const CudaDriver* driver);
  ~CudaImporter() override;

  tensord::v1::DeviceType device_type() const override { return tensord::v1::DEVICE_TYPE_CUDA; }
  // The region is a CudaRegion.
  absl::StatusOr<std::unique_ptr<ImportedRegion>> Import(const FetchedBuffer& buffer, MapMode mode,
                                                         const std::string& what) override;
  // Sets the UUID of this process's device `device.index()`.
  absl::Status NameDevice(tensord::v1::Device& device) const override;
  // A legacy IPC handle for `bytes` of device memory this process has at `ptr` (memory from
  // cuMemAlloc / cudaMalloc, as a caching allocator such as torch's hands out): the device
  // from cuPointerGetAttribute(DEVICE_ORDINAL), which must be `device`; then, in that
  // device's primary context, the allocation from cuMemGetAddressRange and
  // cuIpcGetMemHandle of its base. The handle names the allocation's size, the offset of
  // `ptr` in it, and the device's UUID; whoever opens it reaches the WHOLE allocation (with
  // a caching allocator: the rest of its segment, other tensors included). Not verified on
  // hardware. INVALID_ARGUMENT naming `what` for a pointer the driver does not know, on
  // another device, or `bytes` past the end of the allocation; the driver's error
  // otherwise (memory cuIpcGetMemHandle refuses, such as a VMM or stream-ordered pool
  // allocation); UNAVAILABLE without a driver.
  absl::StatusOr<MemoryHandle> ExportExisting(const void* ptr, uint64_t bytes, const tensord::v1::Device& device,
                                              const std::string& what) const override;
  // CudaStreamOrder over this importer's driver: events (cuda_stream_order.h).
  const StreamOrder* stream_order() const override;

  class IpcOpens;  // the legacy IPC open cache (cuda_importer.cc)

 private:
  const CudaDriver* const driver_;  // null: CudaDriver::Get() at the first Import
  // shared_ptr: regions keep the cache alive after the importer goes.
  const std::shared_ptr<IpcOpens> ipc_opens_;
};

}  // namespace tensord::common
