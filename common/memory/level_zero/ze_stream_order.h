// Stream order (stream_order.h) on Level Zero devices, with events.
//
// "Streams" are command lists: a stream argument is a ze_command_list_handle_t (immediate
// or regular; on a regular list the appended operations run when the program executes it),
// in the context this process's tensord imports use (ZeProcessContexts), because Level
// Zero requires a command list and the events appended to it to share a context. Level
// Zero has no default stream: the values 0, 1 and 2 (DLPack's "none", CUDA's legacy and
// per-thread default streams) mean "no command list", and the order is kept on the host:
//  - ready: the producer signals from the host at publish (its writes must be done); a
//    consumer waits on the host, at most kZeHostWaitLimit, before the acquire returns;
//  - done: nothing to wait for (the consumer's host work ended before its release);
//  - copies run synchronously on an immediate command list tensord keeps per device.
//
// Ready events live in the buffer's IPC event pool, which the daemon made and every
// importer opened (ze_backend.h): the fence (ze_handle.h's ZeReadyFence) names the device
// and the event. Publishing appends a reset (when the event was signalled before) and a
// signal to the producer's list; a consumer appends a wait to its own. No host blocks.
//
// Done events are plain host-visible events from pools this process keeps per context,
// reused once the DoneFence holding one is gone; Complete() is zeEventQueryStatus.
//
// ZeRegionOrder is one buffer's order (its opened pool's event); a region without a pool
// (a producer's own view of memory it exported) orders on the host: RecordReady appends a
// signal of a done event to the list and waits for it, and the fence is empty.
//
// Not verified on hardware: only the software driver (tests/fake_ze) through the real
// loader has run this.
#pragma once

#include <level_zero/ze_api.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/memory/level_zero/ze_loader.h"
#include "common/memory/stream_order.h"

namespace tensord::common {

inline constexpr std::chrono::seconds kZeHostWaitLimit{60};

// True for the stream values that name no command list.
inline bool IsZeHostStream(uintptr_t stream) { return stream <= 2; }

class ZeRegionOrder final : public StreamOrder {
 public:
  // `ready`: the buffer's ready event in this process, on the device with 16-byte `uuid`,
  // in `context`. The caller keeps the event alive longer.
  ZeRegionOrder(const ZeLoader* loader, ze_context_handle_t context, ze_device_handle_t device, std::string uuid,
                ze_event_handle_t ready);
  // No pool (host order, see above): the device is the ordinal each call names, in the
  // process's context for its driver (ZeProcessContexts).
  explicit ZeRegionOrder(const ZeLoader* loader);

  absl::StatusOr<std::string> RecordReady(int32_t ordinal, uintptr_t stream, const std::string& what) const override;
  // The fence's source is not needed: a buffer's ready event is opened once, with its pool.
  absl::Status WaitReady(const ReadyFence& fence, int32_t ordinal, uintptr_t stream,
                         const std::string& what) const override;
  // WaitReady with no command list: a host wait (at most kZeHostWaitLimit).
  absl::Status WaitReadyOnHost(const ReadyFence& fence, int32_t ordinal, const std::string& what) const override {
    return WaitReady(fence, ordinal, 0, what);
  }
  absl::StatusOr<std::unique_ptr<DoneFence>> RecordDone(int32_t ordinal, uintptr_t stream,
                                                        const std::string& what) const override;
  // zeCommandListAppendMemoryCopy on the list; synchronous on tensord's own list for none.
  absl::Status CopyOnStream(void* dst, const void* src, uint64_t bytes, int32_t ordinal, uintptr_t stream,
                            const std::string& what) const override;
  // Not built: UNIMPLEMENTED. (Level Zero copies plain host memory only where the device
  // has shared system allocations; staging would need USM host memory of its own.)
  absl::Status CopyToHost(void* host, const void* src, uint64_t bytes, int32_t ordinal,
                          const std::string& what) const override;
  absl::Status CopyFromHost(void* dst, const void* host, uint64_t bytes, int32_t ordinal,
                            const std::string& what) const override;

 private:
  struct Where {
    ze_context_handle_t context;
    ze_device_handle_t device;
  };
  absl::StatusOr<Where> Locate(int32_t ordinal, const std::string& what) const;

  const ZeLoader* const loader_;
  const ze_context_handle_t context_;
  const ze_device_handle_t device_;
  const std::string uuid_;
  const ze_event_handle_t ready_;
};

}  // namespace tensord::common
