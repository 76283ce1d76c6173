// ZeImporter: the client half of the level_zero memory kind. Turns a level_zero buffer's
// handle (ze_handle.h) and its fds into device memory opened in this process.
//
// Contexts. Level Zero memory opened from an IPC handle, and events from an opened pool,
// belong to the context they were opened in, and a command list may only use memory and
// events of its own context. So everything here uses one context per driver: the one the
// program handed over with UseLevelZeroContext (a SYCL program's native context), or one
// tensord makes on first use. Handing one over after the first import of that driver is
// FAILED_PRECONDITION: earlier regions live in the other context.
//
// Import: the device by the handle's UUID (this process's ordinal may differ from the
// daemon's: ZE_AFFINITY_MASK), the received fd written into the handle bytes
// (ZeLoader::MemoryHandleWithFd), zeMemOpenIpcHandle; the buffer's ready-event pool with
// zeEventPoolOpenIpcHandle and its event with zeEventCreate. Opening one allocation twice
// in a process costs the driver a second mapping, so opens are cached per allocation, and
// pools per buffer (keyed by their fd's file: its device and inode, the same for every fd
// of one dma-buf), refcounted, shared by every region and view, and closed
// (zeMemCloseIpcHandle; zeEventDestroy + zeEventPoolCloseIpcHandle) when the last region
// that uses them goes. Two buffers may share an allocation (two exports from one block),
// never a pool. The fds may be closed once Import returns.
//
// Access: device memory has neither copy-on-write nor, in the 1.4 API, read-only opens:
// every mode opens read-write; kPrivate is shared (a consumer's writes reach every reader)
// and kSharedReadOnly is only the DLPack flag. The client says so (docs/memory-backends.md).
//
// Exports (ExportExisting): memory this process allocated with zeMemAllocDevice in the
// context above; see the method.
//
// Errors: INVALID_ARGUMENT for a malformed handle or a wrong fd count, DATA_LOSS when the
// handle backs fewer bytes than the buffer, FAILED_PRECONDITION for a device this process
// does not see, UNAVAILABLE when the loader is; the driver's result otherwise. Messages
// name `what`. Thread-safe; a region's destructor takes only the open cache's lock and
// never throws.
#pragma once

#include <level_zero/ze_api.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/memory/importer.h"
#include "common/memory/level_zero/ze_loader.h"

namespace tensord::common {

// The context per driver this process's imports use (see above). Process-wide, never
// destroyed (a DLPack deleter may close a region during exit).
class ZeProcessContexts {
 public:
  static ZeProcessContexts& Get();
  // Use `context` (of `driver`) from now on. FAILED_PRECONDITION once tensord has used
  // another context of that driver in this process; INVALID_ARGUMENT for null handles.
  absl::Status Use(ze_driver_handle_t driver, ze_context_handle_t context);
  // The context for `driver`: the program's, or one made now (and kept) if none yet.
  absl::StatusOr<ze_context_handle_t> For(const ZeLoader& loader, ze_driver_handle_t driver);

  class State;

 private:
  ZeProcessContexts();
  State* const state_;
};

class ZeImporter final : public Importer {
 public:
  // Uses the process's loader (ZeLoader::Get(), loaded on the first Import).
  ZeImporter();
  explicit ZeImporter(const ZeLoader* loader);
  ~ZeImporter() override;

  tensord::v1::DeviceType device_type() const override { return tensord::v1::DEVICE_TYPE_ONEAPI; }
  absl::StatusOr<std::unique_ptr<ImportedRegion>> Import(const FetchedBuffer& buffer, MapMode mode,
                                                         const std::string& what) override;
  // Sets the UUID of this process's device `device.index()`.
  absl::Status NameDevice(tensord::v1::Device& device) const override;
  // A producer export of `bytes` at `ptr`: a device allocation (zeMemGetAllocProperties)
  // on `device`, in this process's context; its base and size from zeMemGetAddressRange,
  // zeMemGetIpcHandle of the base. The handle (kProducerExport, no event pool) names the
  // allocation, the offset of `ptr` in it and the device; its one fd is a dup of the
  // driver's. Whoever opens it reaches the whole allocation. INVALID_ARGUMENT naming `what`
  // for memory that is not a device allocation of that device, or bytes past its end.
  absl::StatusOr<MemoryHandle> ExportExisting(const void* ptr, uint64_t bytes, const tensord::v1::Device& device,
                                              const std::string& what) const override;
  // The order of a producer's own view of an export (no pool: host order,
  // ze_stream_order.h). Imported regions have their own, from their buffer's pool.
  const StreamOrder* stream_order() const override;

  class Opens;  // the open cache (ze_importer.cc)

 private:
  const ZeLoader& loader() const;
  const ZeLoader* const loader_;  // null: ZeLoader::Get() at first use
  // shared_ptr: regions keep the cache alive after the importer goes.
  const std::shared_ptr<Opens> opens_;
};

}  // namespace tensord::common
