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
// Done fences are plain events (CU_EVENT_DISABLE_TIMING), pooled and reused once the
// DoneFence that held one is gone; Complete() is cuEventQuery, which never blocks.
//
// Contexts: every call runs in the device's primary context (pushed, then popped), the one
// the CUDA runtime and torch use, so streams created there are valid here.
//
// Not verified on hardware: only the software stand-in (tests/fake_cuda) has run this.
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

  // The process's instance over `driver` (CudaDriver::Get() in production; tests load
  // others), made on first use and never destroyed, as the StreamOrder contract asks.
  static const CudaStreamOrder& For(const CudaDriver& driver);
  static const CudaStreamOrder& Get() { return For(CudaDriver::Get()); }
  ~CudaStreamOrder() override;
  CudaStreamOrder(const CudaStreamOrder&) = delete;
  CudaStreamOrder& operator=(const CudaStreamOrder&) = delete;

  absl::StatusOr<std::string> RecordReady(int32_t ordinal, uintptr_t stream, const std::string& what) const override;
  absl::Status WaitReady(std::string_view fence, int32_t ordinal, uintptr_t stream,
                         const std::string& what) const override;
  absl::StatusOr<std::unique_ptr<DoneFence>> RecordDone(int32_t ordinal, uintptr_t stream,
                                                        const std::string& what) const override;
  // cuMemcpyDtoDAsync.
  absl::Status CopyOnStream(void* dst, const void* src, uint64_t bytes, int32_t ordinal, uintptr_t stream,
                            const std::string& what) const override;

  class Pools;  // the event pools (cuda_stream_order.cc)

 private:
  explicit CudaStreamOrder(const CudaDriver* driver);

  const CudaDriver* const driver_;
  // shared_ptr: a DoneFence gives its event back to the pool after the order is gone.
  const std::shared_ptr<Pools> pools_;
};

}  // namespace tensord::common
