#include "common/memory/cuda/cuda_stream_order.h"

#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/memory/cuda/cuda_handle.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace tensord::common {

class CudaStreamOrder::Pools {
 public:
  struct ReadyEvent {
    CUevent event = nullptr;
    std::string fence;  // its encoded fence, made once: the IPC handle of an event is fixed
  };
  struct Device {
    std::vector<ReadyEvent> ready;
    size_t cursor = 0;                // the next ready event to consider reusing
    std::vector<CUevent> done_free;   // done events no DoneFence holds
  };

  // Another process's ready event, opened here (kept, see the header).
  struct Opened {
    CUevent event = nullptr;
    CUdevice device = 0;
    std::list<std::string>::iterator recent;  // its place in `recency`
  };

  absl::Mutex mu;
  std::map<CUdevice, Device> devices ABSL_GUARDED_BY(mu);
  // This process's own ready fences, to wait on without opening them.
  absl::flat_hash_map<std::string, CUevent> own ABSL_GUARDED_BY(mu);
  // By source + fence bytes; `recency` holds the keys, least recently used first.
  absl::flat_hash_map<std::string, Opened> opened ABSL_GUARDED_BY(mu);
  std::list<std::string> recency ABSL_GUARDED_BY(mu);
};

namespace {

std::once_flag g_pool_full_logged;
std::once_flag g_gone_logged;

// The CUdevice and primary context of this process's ordinal `ordinal`.
absl::StatusOr<CUdevice> DeviceOf(const CudaDriver& driver, int32_t ordinal, const std::string& what) {
  if (!driver.available()) return absl::UnavailableError(absl::StrCat(what, ": cuda: ", driver.unavailable_reason()));
  CUdevice device = 0;
  TENSORD_RETURN_IF_ERROR(
      driver.CudaStatus(driver.cuDeviceGet(&device, ordinal), absl::StrCat(what, ": cuDeviceGet ", ordinal)));
  return device;
}

// A result of cuIpcOpenEventHandle that means the exporting process (and its event) is gone.
bool ExporterGone(CUresult r) {
  return r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_MAP_FAILED ||
         r == CUDA_ERROR_NOT_FOUND;
}

class CudaDoneFence final : public DoneFence {
 public:
  CudaDoneFence(std::shared_ptr<CudaStreamOrder::Pools> pools, const CudaDriver* driver, CUdevice device,
                CUevent event)
      : pools_(std::move(pools)), driver_(driver), device_(device), event_(event) {}
  ~CudaDoneFence() override {
    absl::MutexLock lock(&pools_->mu);
    pools_->devices[device_].done_free.push_back(event_);
  }

  bool Complete() override {
    auto context = ScopedCudaContext::Push(*driver_, device_);
    if (!context.ok()) return Broken(context.status().ToString());
    const CUresult r = driver_->cuEventQuery(event_);
    if (r == CUDA_SUCCESS) return true;
    if (r == CUDA_ERROR_NOT_READY) return false;
    return Broken(driver_->ErrorText(r));
  }

  void Wait() override {
    auto context = ScopedCudaContext::Push(*driver_, device_);
    if (!context.ok()) {
      Broken(context.status().ToString());
      return;
    }
    if (CUresult r = driver_->cuEventSynchronize(event_); r != CUDA_SUCCESS) Broken(driver_->ErrorText(r));
  }

 private:
  bool Broken(const std::string& why) {
    spdlog::error("cuda: a done fence on cuda device {} cannot be queried ({}); releasing without it", device_,
                  why);
    return true;
  }

  const std::shared_ptr<CudaStreamOrder::Pools> pools_;
  const CudaDriver* const driver_;
  const CUdevice device_;
  const CUevent event_;
};

}  // namespace

const CudaStreamOrder& CudaStreamOrder::For(const CudaDriver& driver) {
  static absl::Mutex mu;
  static auto* orders = new std::map<const CudaDriver*, const CudaStreamOrder*>();
  absl::MutexLock lock(&mu);
  const CudaStreamOrder*& order = (*orders)[&driver];
  if (order == nullptr) order = new CudaStreamOrder(&driver);
  return *order;
}

CudaStreamOrder::CudaStreamOrder(const CudaDriver* driver) : driver_(driver), pools_(std::make_shared<Pools>()) {}

// Events are never destroyed here: consumers may still open ready events (see the header),
// and the process's exit frees them all.
CudaStreamOrder::~CudaStreamOrder() = default;

absl::StatusOr<std::string> CudaStreamOrder::RecordReady(int32_t ordinal, uintptr_t stream,
                                                         const std::string& what) const {
  const CudaDriver& driver = *driver_;
  TENSORD_ASSIGN_OR_RETURN(CUdevice device, DeviceOf(driver, ordinal, what));
  TENSORD_ASSIGN_OR_RETURN(std::string uuid, driver.DeviceUuid(device));
  TENSORD_ASSIGN_OR_RETURN(ScopedCudaContext context, ScopedCudaContext::Push(driver, device));
  absl::MutexLock lock(&pools_->mu);
  Pools::Device& pool = pools_->devices[device];
  Pools::ReadyEvent* chosen = nullptr;
  // A few candidates at the cursor: the oldest recordings are the likeliest to be done.
  for (size_t i = 0; i < std::min<size_t>(4, pool.ready.size()); ++i) {
    Pools::ReadyEvent& candidate = pool.ready[pool.cursor];
    pool.cursor = (pool.cursor + 1) % pool.ready.size();
    if (driver.cuEventQuery(candidate.event) == CUDA_SUCCESS) {
      chosen = &candidate;
      break;
    }
  }
  if (chosen == nullptr && pool.ready.size() < kMaxReadyEvents) {
    CUevent event = nullptr;
    TENSORD_RETURN_IF_ERROR(
        driver.CudaStatus(driver.cuEventCreate(&event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING),
                          absl::StrCat(what, ": cuEventCreate (interprocess) on cuda:", ordinal)));
    CUipcEventHandle ipc;
    if (CUresult r = driver.cuIpcGetEventHandle(&ipc, event); r != CUDA_SUCCESS) {
      driver.cuEventDestroy_v2(event);
      return driver.CudaStatus(r, absl::StrCat(what, ": cuIpcGetEventHandle on cuda:", ordinal));
    }
    CudaEventFence fence;
    fence.uuid = uuid;
    static_assert(sizeof(ipc.reserved) == kCudaIpcHandleBytes);
    std::memcpy(fence.ipc_event.data(), ipc.reserved, kCudaIpcHandleBytes);
    pool.ready.push_back({event, EncodeCudaEventFence(fence)});
    pools_->own.emplace(pool.ready.back().fence, event);
    chosen = &pool.ready.back();
  }
  if (chosen == nullptr) {
    // Every event is still pending: this producer publishes faster than its GPU finishes.
    std::call_once(g_pool_full_logged, [&] {
      spdlog::warn("cuda: {} publishes on cuda:{} have work still pending; a publish now waits for the oldest",
                   kMaxReadyEvents, ordinal);
    });
    chosen = &pool.ready[pool.cursor];
    pool.cursor = (pool.cursor + 1) % pool.ready.size();
    TENSORD_RETURN_IF_ERROR(driver.CudaStatus(driver.cuEventSynchronize(chosen->event),
                                              absl::StrCat(what, ": cuEventSynchronize on cuda:", ordinal)));
  }
  TENSORD_RETURN_IF_ERROR(
      driver.CudaStatus(driver.cuEventRecord(chosen->event, reinterpret_cast<CUstream>(stream)),
                        absl::StrCat(what, ": cuEventRecord on cuda:", ordinal, " stream ", stream)));
  return chosen->fence;
}

absl::StatusOr<CudaStreamOrder::FenceEvent> CudaStreamOrder::EventOf(const ReadyFence& fence, CUdevice device,
                                                                     int32_t ordinal, const std::string& what) const {
  const CudaDriver& driver = *driver_;
  auto decoded = DecodeCudaEventFence(fence.bytes);
  if (!decoded.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", decoded.status().message()));
  std::string key;
  {
    absl::MutexLock lock(&pools_->mu);
    auto own = pools_->own.find(std::string(fence.bytes));
    if (own != pools_->own.end()) return FenceEvent{own->second, false};
    if (!fence.source.empty()) {
      key.reserve(fence.source.size() + fence.bytes.size());
      key.append(fence.source).append(fence.bytes);
      auto kept = pools_->opened.find(key);
      if (kept != pools_->opened.end()) {
        pools_->recency.splice(pools_->recency.end(), pools_->recency, kept->second.recent);
        return FenceEvent{kept->second.event, false};
      }
    }
  }
  CUipcEventHandle ipc;
  std::memcpy(ipc.reserved, decoded->ipc_event.data(), kCudaIpcHandleBytes);
  CUevent opened = nullptr;
  if (CUresult r = driver.cuIpcOpenEventHandle(&opened, ipc); r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_INVALID_CONTEXT) {
      // Seen on an H200 when the producer runs in another PID namespace: legacy IPC events
      // do not cross it (the memory does, as a VMM fd).
      return driver.CudaStatus(
          r, absl::StrCat(what, ": cuIpcOpenEventHandle on cuda:", ordinal,
                          ": the producer's ready event cannot be opened in this process, as when the producer "
                          "runs in another PID namespace; such a producer synchronizes its writes and "
                          "publishes with no ready event (PublishOptions::stream = kNoStream, Python stream=-1)"));
    }
    if (!ExporterGone(r)) {
      return driver.CudaStatus(r, absl::StrCat(what, ": cuIpcOpenEventHandle on cuda:", ordinal));
    }
    std::call_once(g_gone_logged, [&] {
      spdlog::warn("cuda: {}: the producer's ready event is gone ({}): its process exited, and its queued work "
                   "with it; not waiting",
                   what, driver.ErrorText(r));
    });
    return FenceEvent{};
  }
  if (key.empty()) return FenceEvent{opened, true};
  CUevent evicted = nullptr;
  CUdevice evicted_device = 0;
  {
    absl::MutexLock lock(&pools_->mu);
    auto [it, inserted] = pools_->opened.try_emplace(key);
    if (!inserted) {
      // Another thread opened it meanwhile: use the kept one, drop ours.
      pools_->recency.splice(pools_->recency.end(), pools_->recency, it->second.recent);
      evicted = opened;
      evicted_device = device;
      opened = it->second.event;
    } else {
      it->second.event = opened;
      it->second.device = device;
      it->second.recent = pools_->recency.insert(pools_->recency.end(), key);
      if (pools_->opened.size() > kMaxOpenedReadyEvents) {
        auto oldest = pools_->opened.find(pools_->recency.front());
        evicted = oldest->second.event;
        evicted_device = oldest->second.device;
        pools_->opened.erase(oldest);
        pools_->recency.pop_front();
      }
    }
  }
  if (evicted != nullptr) {
    // Enqueued waits on an event do not need it to exist any more.
    auto context = ScopedCudaContext::Push(driver, evicted_device);
    CUresult r = context.ok() ? driver.cuEventDestroy_v2(evicted) : CUDA_ERROR_INVALID_CONTEXT;
    if (r != CUDA_SUCCESS) spdlog::error("cuda: {}: cuEventDestroy of an opened ready event: {}", what, driver.ErrorText(r));
  }
  return FenceEvent{opened, false};
}

void CudaStreamOrder::Done(const FenceEvent& used, const std::string& what) const {
  if (!used.destroy_after_use || used.event == nullptr) return;
  // The wait is enqueued (or over): this process's copy of the event is no longer needed.
  if (CUresult r = driver_->cuEventDestroy_v2(used.event); r != CUDA_SUCCESS) {
    spdlog::error("cuda: {}: cuEventDestroy of an opened ready event: {}", what, driver_->ErrorText(r));
  }
}

absl::Status CudaStreamOrder::WaitReady(const ReadyFence& fence, int32_t ordinal, uintptr_t stream,
                                        const std::string& what) const {
  const CudaDriver& driver = *driver_;
  TENSORD_ASSIGN_OR_RETURN(CUdevice device, DeviceOf(driver, ordinal, what));
  TENSORD_ASSIGN_OR_RETURN(ScopedCudaContext context, ScopedCudaContext::Push(driver, device));
  TENSORD_ASSIGN_OR_RETURN(FenceEvent event, EventOf(fence, device, ordinal, what));
  if (event.event == nullptr) return absl::OkStatus();
  absl::Status waited =
      driver.CudaStatus(driver.cuStreamWaitEvent(reinterpret_cast<CUstream>(stream), event.event, 0),
                        absl::StrCat(what, ": cuStreamWaitEvent on cuda:", ordinal, " stream ", stream));
  Done(event, what);
  return waited;
}

absl::Status CudaStreamOrder::WaitReadyOnHost(const ReadyFence& fence, int32_t ordinal, const std::string& what) const {
  const CudaDriver& driver = *driver_;
  TENSORD_ASSIGN_OR_RETURN(CUdevice device, DeviceOf(driver, ordinal, what));
  TENSORD_ASSIGN_OR_RETURN(ScopedCudaContext context, ScopedCudaContext::Push(driver, device));
  TENSORD_ASSIGN_OR_RETURN(FenceEvent event, EventOf(fence, device, ordinal, what));
  if (event.event == nullptr) return absl::OkStatus();
  absl::Status waited = driver.CudaStatus(driver.cuEventSynchronize(event.event),
                                          absl::StrCat(what, ": cuEventSynchronize on cuda:", ordinal));
  Done(event, what);
  return waited;
}

absl::StatusOr<std::unique_ptr<DoneFence>> CudaStreamOrder::RecordDone(int32_t ordinal, uintptr_t stream,
                                                                      const std::string& what) const {
  const CudaDriver& driver = *driver_;
  TENSORD_ASSIGN_OR_RETURN(CUdevice device, DeviceOf(driver, ordinal, what));
  TENSORD_ASSIGN_OR_RETURN(ScopedCudaContext context, ScopedCudaContext::Push(driver, device));
  CUevent event = nullptr;
  {
    absl::MutexLock lock(&pools_->mu);
    std::vector<CUevent>& free = pools_->devices[device].done_free;
    if (!free.empty()) {
      event = free.back();
      free.pop_back();
    }
  }
  if (event == nullptr) {
    TENSORD_RETURN_IF_ERROR(driver.CudaStatus(driver.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING),
                                              absl::StrCat(what, ": cuEventCreate on cuda:", ordinal)));
  }
  // From here the fence owns the event and gives it back to the pool, also on failure.
  auto done = std::make_unique<CudaDoneFence>(pools_, driver_, device, event);
  TENSORD_RETURN_IF_ERROR(
      driver.CudaStatus(driver.cuEventRecord(event, reinterpret_cast<CUstream>(stream)),
                        absl::StrCat(what, ": cuEventRecord on cuda:", ordinal, " stream ", stream)));
  return std::unique_ptr<DoneFence>(std::move(done));
}

absl::Status CudaStreamOrder::CopyOnStream(void* dst, const void* src, uint64_t bytes, int32_t ordinal,
                                           uintptr_t stream, const std::string& what) const {
  const CudaDriver& driver = *driver_;
  TENSORD_ASSIGN_OR_RETURN(CUdevice device, DeviceOf(driver, ordinal, what));
  TENSORD_ASSIGN_OR_RETURN(ScopedCudaContext context, ScopedCudaContext::Push(driver, device));
  return driver.CudaStatus(
      driver.cuMemcpyDtoDAsync_v2(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), bytes,
                                  reinterpret_cast<CUstream>(stream)),
      absl::StrCat(what, ": cuMemcpyDtoDAsync of ", bytes, " bytes on cuda:", ordinal, " stream ", stream));
}

absl::Status CudaStreamOrder::CopyToHost(void* host, const void* src, uint64_t bytes, int32_t ordinal,
                                         const std::string& what) const {
  const CudaDriver& driver = *driver_;
  TENSORD_ASSIGN_OR_RETURN(CUdevice device, DeviceOf(driver, ordinal, what));
  TENSORD_ASSIGN_OR_RETURN(ScopedCudaContext context, ScopedCudaContext::Push(driver, device));
  return driver.CudaStatus(driver.cuMemcpyDtoH_v2(host, reinterpret_cast<CUdeviceptr>(src), bytes),
                           absl::StrCat(what, ": cuMemcpyDtoH of ", bytes, " bytes from cuda:", ordinal));
}

absl::Status CudaStreamOrder::CopyFromHost(void* dst, const void* host, uint64_t bytes, int32_t ordinal,
                                           const std::string& what) const {
  const CudaDriver& driver = *driver_;
  TENSORD_ASSIGN_OR_RETURN(CUdevice device, DeviceOf(driver, ordinal, what));
  TENSORD_ASSIGN_OR_RETURN(ScopedCudaContext context, ScopedCudaContext::Push(driver, device));
  TENSORD_RETURN_IF_ERROR(
      driver.CudaStatus(driver.cuMemcpyHtoD_v2(reinterpret_cast<CUdeviceptr>(dst), host, bytes),
                        absl::StrCat(what, ": cuMemcpyHtoD of ", bytes, " bytes to cuda:", ordinal)));
  CUevent landed = nullptr;
  TENSORD_RETURN_IF_ERROR(driver.CudaStatus(driver.cuEventCreate(&landed, CU_EVENT_DISABLE_TIMING),
                                            absl::StrCat(what, ": cuEventCreate on cuda:", ordinal)));
  absl::Status waited = driver.CudaStatus(driver.cuEventRecord(landed, CU_STREAM_LEGACY),
                                          absl::StrCat(what, ": cuEventRecord on cuda:", ordinal));
  if (waited.ok()) {
    waited = driver.CudaStatus(driver.cuEventSynchronize(landed),
                               absl::StrCat(what, ": cuEventSynchronize on cuda:", ordinal));
  }
  if (CUresult r = driver.cuEventDestroy_v2(landed); r != CUDA_SUCCESS) {
    spdlog::error("cuda: {}: cuEventDestroy: {}", what, driver.ErrorText(r));
  }
  return waited;
}

}  // namespace tensord::common
