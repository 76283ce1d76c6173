// Importer: the client half of the memory seam. One per device type turns a buffer's
// handle (as FETCH_FD returned it) into a region mapped in this process; the client's
// mapping cache keeps regions by (broker instance, buffer id, mode, view kind) whatever
// the device.
//
// An importer may also make another kind of view of a buffer of some other device type:
// the cuda backend's CUDA_HOST importer maps host memory and pins it (cuda_host_importer.h).
// The mapping cache picks that importer by the view asked for, and keys the view kind too.
//
// An ImportedRegion owns what the import made (a host mmap; a device virtual-address
// reservation, its mapping and the imported allocation) and undoes it in its destructor.
// The destructor must not block on a lock the client holds: it runs where the last
// reference to a mapping goes (the release sender, a DLPack deleter after the client
// stopped). data() is a pointer on the buffer's device: a host address for host memory, a
// device address for a GPU.
//
// Thread-safe: Import may run on several threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/memory/host/mapped_region.h"
#include "common/memory/memory_handle.h"
#include "common/memory/stream_order.h"
#include "tensord/v1/tensor.pb.h"

namespace tensord::common {

class ImportedRegion {
 public:
  virtual ~ImportedRegion() = default;
  virtual uint8_t* data() const = 0;
  virtual uint64_t size() const = 0;
  virtual MapMode mode() const = 0;
  // This process's ordinal of the region's device: the consumer's DLDevice.device_id,
  // which may differ from the producer's and the daemon's. 0 for host memory.
  virtual int32_t device_ordinal() const { return 0; }
  // The device type views of this region name when it is not the buffer's own: a pinned
  // view of host memory is DEVICE_TYPE_CUDA_HOST. UNSPECIFIED (the default): the buffer's.
  virtual tensord::v1::DeviceType view_device_type() const { return tensord::v1::DEVICE_TYPE_UNSPECIFIED; }
  // How work on this memory is ordered between processes (stream_order.h); null for
  // memory no stream writes (host memory). Lives at least as long as the region.
  virtual const StreamOrder* stream_order() const { return nullptr; }
  // Copy-on-write host mappings: throws away this process's private copies of the pages of
  // [offset, offset + length) so they read the buffer again. Other regions have no private
  // copies: OK, nothing done.
  virtual absl::Status DiscardPrivatePages(uint64_t offset, uint64_t length) const {
    (void)offset;
    (void)length;
    return absl::OkStatus();
  }
};

// Memory this process had before it exported it (ExportExisting): the producer's own view
// of its export is its own pointer, never an import of its own handle (a process cannot
// open its own CUDA IPC handle). Unmaps and frees nothing; holds `source`, if any, for as
// long as the region lives, so a caller can tie the memory's owner to the views of it.
class BorrowedRegion final : public ImportedRegion {
 public:
  BorrowedRegion(void* data, uint64_t size, MapMode mode, int32_t device_ordinal,
                 const StreamOrder* stream_order, std::shared_ptr<const void> source)
      : data_(static_cast<uint8_t*>(data)),
        size_(size),
        mode_(mode),
        device_ordinal_(device_ordinal),
        stream_order_(stream_order),
        source_(std::move(source)) {}
  uint8_t* data() const override { return data_; }
  uint64_t size() const override { return size_; }
  MapMode mode() const override { return mode_; }
  int32_t device_ordinal() const override { return device_ordinal_; }
  const StreamOrder* stream_order() const override { return stream_order_; }

 private:
  uint8_t* const data_;
  const uint64_t size_;
  const MapMode mode_;
  const int32_t device_ordinal_;
  const StreamOrder* const stream_order_;
  const std::shared_ptr<const void> source_;
};

// A buffer as the broker handed it out.
struct FetchedBuffer {
  uint64_t buffer_id = 0;
  uint64_t size = 0;  // the bytes the broker says the buffer holds
  tensord::v1::DeviceType device_type = tensord::v1::DEVICE_TYPE_CPU;
  MemoryHandle handle;
  // The producer is about to write the whole buffer (a dedicated one): an importer that can
  // map every page in one call (host: MADV_POPULATE_WRITE) does so, sparing a fault per page.
  bool populate = false;
};

class Importer {
 public:
  virtual ~Importer() = default;
  virtual tensord::v1::DeviceType device_type() const = 0;
  // Maps `buffer` in `mode`. kSharedWritable is the producer's own mapping: for host memory
  // the importer then seals the memfd F_SEAL_FUTURE_WRITE, which is what protects readers.
  // The handle's fds may be closed once this returns. DATA_LOSS when the handle does not
  // back `buffer.size` bytes, FAILED_PRECONDITION when it is not safe to map; errors name
  // `what`.
  virtual absl::StatusOr<std::unique_ptr<ImportedRegion>> Import(const FetchedBuffer& buffer, MapMode mode,
                                                                 const std::string& what) = 0;
  // A take cannot be undone, so before one the client asks what would make Import refuse
  // the tensor it gets: CheckUsable says why this importer cannot map anything in this
  // process (no driver), and the memory type a view importer maps (a pinned view maps
  // DEVICE_TYPE_CPU memory) goes to the broker, which refuses a tensor of another type
  // without unbinding it. UNSPECIFIED (the default): an importer of the memory's own type.
  virtual absl::Status CheckUsable(const std::string& what) const {
    (void)what;
    return absl::OkStatus();
  }
  virtual tensord::v1::DeviceType viewed_memory_type() const { return tensord::v1::DEVICE_TYPE_UNSPECIFIED; }
  // Completes a device this process names by its own ordinal with the name that holds in
  // every process (a GPU's UUID), before it goes to the broker. Host memory needs none.
  // FAILED_PRECONDITION / UNAVAILABLE when there is no such device here.
  virtual absl::Status NameDevice(tensord::v1::Device& device) const {
    (void)device;
    return absl::OkStatus();
  }
  // The handle other processes import to reach `bytes` of memory this process already has
  // at `ptr` on `device` (as NameDevice completed it), for the broker's Export: the buffer
  // the handle names starts at `ptr`. The handle may give importers more than those bytes
  // (CUDA legacy IPC opens the whole allocation that holds `ptr`). The memory stays the
  // caller's, who must keep it alive. UNIMPLEMENTED (the default) where the memory kind
  // cannot be exported by pointer; INVALID_ARGUMENT naming `what` for a pointer the
  // memory kind does not know, or bytes past the end of its allocation.
  // Inline, as the other defaults: the importers' own libraries need no vtable from here.
  // (stream_order() below: the same order the regions of this kind use; null for host.)
  virtual absl::StatusOr<MemoryHandle> ExportExisting(const void* ptr, uint64_t bytes,
                                                      const tensord::v1::Device& device,
                                                      const std::string& what) const {
    (void)ptr;
    (void)bytes;
    return absl::UnimplementedError(what + ": " + tensord::v1::DeviceType_Name(device.type()) +
                                    " memory cannot be exported by pointer");
  }
  virtual const StreamOrder* stream_order() const { return nullptr; }
};

// The importer of a device type this build lacks the backend of, so that asking for it
// says why: Import and NameDevice answer UNIMPLEMENTED "<what>: <type> needs the <backend>
// backend, which this build does not have: <reason>".
class UnbuiltImporter final : public Importer {
 public:
  UnbuiltImporter(tensord::v1::DeviceType type, std::string backend, std::string reason)
      : type_(type), backend_(std::move(backend)), reason_(std::move(reason)) {}
  tensord::v1::DeviceType device_type() const override { return type_; }
  absl::StatusOr<std::unique_ptr<ImportedRegion>> Import(const FetchedBuffer& buffer, MapMode mode,
                                                         const std::string& what) override;
  absl::Status NameDevice(tensord::v1::Device& device) const override;
  absl::Status CheckUsable(const std::string& what) const override { return Unbuilt(what); }

 private:
  absl::Status Unbuilt(const std::string& what) const;
  const tensord::v1::DeviceType type_;
  const std::string backend_;
  const std::string reason_;
};

// The importers of one client, by device type (memory/backends.h makes those this build
// has: host always, the GPU ones when built; each loads its driver on first use).
class Importers {
 public:
  explicit Importers(std::vector<std::unique_ptr<Importer>> importers);
  Importers(const Importers&) = delete;
  Importers& operator=(const Importers&) = delete;
  // UNIMPLEMENTED naming the device type when this build cannot import it.
  absl::StatusOr<Importer*> For(tensord::v1::DeviceType type) const;
  // For(device.type())->NameDevice(device).
  absl::Status NameDevice(tensord::v1::Device& device) const;

 private:
  std::map<tensord::v1::DeviceType, std::unique_ptr<Importer>> by_type_;
};

}  // namespace tensord::common
