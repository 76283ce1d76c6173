// CudaStreamOrder: stream order (stream_order.h) on CUDA devices, with events.
//
// Ready fences are interprocess events (CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)
// recorded on the producer's stream; the fence carries the event's CUipcEventHandle and
// the device's UUID (cuda_handle.h, CudaEventFence). A consumer opens the handle
// (cuIpcOpenEventHandle), enqueues cuStreamWaitEvent on its stream and destroys its
// opened copy: the wait is on the GPU, the host never blocks.
//
// Lifetime of ready events. Using an opened event after its exporter destroyed it is
// undefined (CUDA's documentation of cuIpcOpenEventHandle), and a consumer may acquire a
// tensor long after it was published. So the producer never destroys a ready event: each
// device keeps a pool of them for the life of the process, and a publish reuses one whose
// last recording has completed (or creates one, up to kMaxReadyEvents per device; past
// that it waits for the oldest on the host, logged once). A consumer that opens a reused
// event waits for a newer recording: later than needed, never too early. Once the
// producer's process is gone its events are too; the broker stops handing its fences out
// when its session closes, and a consumer that still finds the event gone (it opened the
// fence in that window) waits for nothing, which is what the exporter's death means: its
// queued work ended with it.
//
// A fence this process recorded itself (it acquires a tensor it published) is waited on
// directly: a process cannot open its own IPC event handle.
//
// Opened ready events are kept. A producer reuses its ready events, so the same fence comes
// back with its later tensors; the consumer keeps what cuIpcOpenEventHandle gave it under
// (fence source, fence bytes), at most kMaxOpenedReadyEvents of them (the least recently
// used is destroyed first), and a later wait on that fence is one cuStreamWaitEvent. The
// source (the broker's name for the producer's session, ReadyFence) is part of the key
// because the bytes alone could name an event of another process: a producer restarted in
// a container may get its old pid back, and with it the same handle bytes. A fence with no
// source is opened, waited on and destroyed, as before there was a cache. Keeping an
// opened event past its exporter's exit holds only this process's reference to it: a wait
// on it after the exit completes with the exporter's last recording, which is what its
// death means (its queued work ended with it).
//
// Done fences are plain events (CU_EVENT_DISABLE_TIMING), pooled and reused once the
// DoneFence that held one is gone; Complete() is cuEventQuery, which never blocks.
//
// Contexts: every call runs in the device's primary context (pushed, then popped), the one
// the CUDA runtime and torch use, so streams created there are valid here.
//
// Ran on an NVIDIA H200 (docs/gpu-runs/2026-11-27-h200-71a1458): ready and done events
// between processes, kept opened events. WaitReadyOnHost ran only against the stand-in.
#pragma once

#include <cuda.h>

#include <memory>
#include <string>
#include <string_view>

#include "common/memory/cuda/cuda_driver.h"
#include "common/memory/stream_order.h"

namespace tensord::common {

class CudaStreamOrder final : public StreamOrder {
 public:
  // Most ready events a process keeps per device; older CUDA drivers capped the recorded
  // interprocess events of a process at around 22,000.
  static constexpr size_t kMaxReadyEvents = 1024;
  // Most ready events of other processes a process keeps opened (see above).
  static constexpr size_t kMaxOpenedReadyEvents = 1024;

  // The process's instance over `driver` (CudaDriver::Get() in production; tests load
  // others), made on first use and never destroyed, as the StreamOrder contract asks.
  static const CudaStreamOrder& For(const CudaDriver& driver);
  static const CudaStreamOrder& Get() { return For(CudaDriver::Get()); }
  ~CudaStreamOrder() override;
  CudaStreamOrder(const CudaStreamOrder&) = delete;
  CudaStreamOrder& operator=(const CudaStreamOrder&) = delete;

  absl::StatusOr<std::string> RecordReady(int32_t ordinal, uintptr_t stream, const std::string& what) const override;
  absl::Status WaitReady(const ReadyFence& fence, int32_t ordinal, uintptr_t stream,
                         const std::string& what) const override;
  // cuEventSynchronize on the fence's event.
  absl::Status WaitReadyOnHost(const ReadyFence& fence, int32_t ordinal, const std::string& what) const override;
  absl::StatusOr<std::unique_ptr<DoneFence>> RecordDone(int32_t ordinal, uintptr_t stream,
                                                        const std::string& what) const override;
  // cuMemcpyDtoDAsync.
  absl::Status CopyOnStream(void* dst, const void* src, uint64_t bytes, int32_t ordinal, uintptr_t stream,
                            const std::string& what) const override;
  // cuMemcpyDtoH, which returns once the bytes are in pageable host memory.
  absl::Status CopyToHost(void* host, const void* src, uint64_t bytes, int32_t ordinal,
                          const std::string& what) const override;
  // cuMemcpyHtoD, then a host wait on an event recorded after it on the legacy stream: from
  // pageable memory the copy may return before its DMA has reached the device.
  absl::Status CopyFromHost(void* dst, const void* host, uint64_t bytes, int32_t ordinal,
                            const std::string& what) const override;

  class Pools;  // the event pools (cuda_stream_order.cc)

 private:
  explicit CudaStreamOrder(const CudaDriver* driver);
  // The event a fence names in this process, opened or kept (a null event: its exporter is
  // gone, wait for nothing), and whether the caller must destroy it after use (a fence with
  // no source is not kept). Runs in `device`'s primary context, which the caller pushed.
  struct FenceEvent {
    CUevent event = nullptr;
    bool destroy_after_use = false;
  };
  absl::StatusOr<FenceEvent> EventOf(const ReadyFence& fence, CUdevice device, int32_t ordinal,
                                     const std::string& what) const;
  void Done(const FenceEvent& used, const std::string& what) const;

  const CudaDriver* const driver_;
  // shared_ptr: a DoneFence gives its event back to the pool after the order is gone.
  const std::shared_ptr<Pools> pools_;
};

}  // namespace tensord::common
