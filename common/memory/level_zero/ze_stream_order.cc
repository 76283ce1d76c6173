#include "common/memory/level_zero/ze_stream_order.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/memory/level_zero/ze_handle.h"
#include "common/memory/level_zero/ze_importer.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace tensord::common {
namespace {

constexpr uint32_t kDoneEventsPerPool = 256;

// This process's done events and host-order command lists in one context. Made on first
// use, never destroyed: a DoneFence may outlive every client.
class ContextState {
 public:
  static ContextState& For(const ZeLoader& loader, ze_context_handle_t context) {
    static absl::Mutex mu;
    static auto* states = new std::map<ze_context_handle_t, ContextState*>();
    absl::MutexLock lock(&mu);
    ContextState*& state = (*states)[context];
    if (state == nullptr) state = new ContextState(&loader, context);
    return *state;
  }

  // An unsignalled event, reset on the host; give it back with Put.
  absl::StatusOr<ze_event_handle_t> Take(const std::string& what) {
    absl::MutexLock lock(&mu_);
    if (free_.empty()) TENSORD_RETURN_IF_ERROR(GrowLocked(what));
    ze_event_handle_t event = free_.back();
    free_.pop_back();
    if (ze_result_t r = loader_->zeEventHostReset(event); r != ZE_RESULT_SUCCESS) {
      free_.push_back(event);
      return ZeLoader::ZeStatus(r, absl::StrCat(what, ": zeEventHostReset"));
    }
    return event;
  }
  void Put(ze_event_handle_t event) {
    absl::MutexLock lock(&mu_);
    free_.push_back(event);
  }

  // tensord's own immediate command list on `device`, for work with no list of the caller's.
  // Used under the returned lock: command lists are not thread-safe.
  absl::StatusOr<ze_command_list_handle_t> HostList(ze_device_handle_t device, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu) {
    ze_command_list_handle_t& list = lists_[device];
    if (list != nullptr) return list;
    ze_command_queue_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
    desc.mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS;
    TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(loader_->zeCommandListCreateImmediate(context_, device, &desc, &list),
                                               absl::StrCat(what, ": zeCommandListCreateImmediate")));
    return list;
  }
  absl::Mutex list_mu;

 private:
  ContextState(const ZeLoader* loader, ze_context_handle_t context) : loader_(loader), context_(context) {}

  absl::Status GrowLocked(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ze_event_pool_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC;
    desc.flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE;
    desc.count = kDoneEventsPerPool;
    ze_event_pool_handle_t pool = nullptr;
    // No devices named: visible to every device of the context.
    TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(loader_->zeEventPoolCreate(context_, &desc, 0, nullptr, &pool),
                                               absl::StrCat(what, ": zeEventPoolCreate")));
    for (uint32_t i = 0; i < kDoneEventsPerPool; ++i) {
      ze_event_desc_t event_desc{};
      event_desc.stype = ZE_STRUCTURE_TYPE_EVENT_DESC;
      event_desc.index = i;
      event_desc.signal = ZE_EVENT_SCOPE_FLAG_HOST;
      event_desc.wait = ZE_EVENT_SCOPE_FLAG_HOST;
      ze_event_handle_t event = nullptr;
      if (ze_result_t r = loader_->zeEventCreate(pool, &event_desc, &event); r != ZE_RESULT_SUCCESS) {
        if (i == 0) return ZeLoader::ZeStatus(r, absl::StrCat(what, ": zeEventCreate"));
        break;
      }
      free_.push_back(event);
    }
    return absl::OkStatus();
  }

  const ZeLoader* const loader_;
  const ze_context_handle_t context_;
  absl::Mutex mu_;
  std::vector<ze_event_handle_t> free_ ABSL_GUARDED_BY(mu_);
  std::map<ze_device_handle_t, ze_command_list_handle_t> lists_ ABSL_GUARDED_BY(list_mu);
};

class ZeDoneFence final : public DoneFence {
 public:
  ZeDoneFence(const ZeLoader* loader, ContextState* state, ze_event_handle_t event)
      : loader_(loader), state_(state), event_(event) {}
  ~ZeDoneFence() override {
    // An event still pending would be reset under work that signals it later: it is
    // never reused instead (release paths drop only complete fences, so this is rare).
    if (complete_ || Complete()) state_->Put(event_);
  }
  bool Complete() override {
    if (complete_) return true;
    ze_result_t r = loader_->zeEventQueryStatus(event_);
    if (r == ZE_RESULT_NOT_READY) return false;
    if (r != ZE_RESULT_SUCCESS) spdlog::error("level_zero: a done event: zeEventQueryStatus: {}", ZeLoader::ResultName(r));
    complete_ = true;
    return true;
  }
  void Wait() override {
    if (complete_) return;
    ze_result_t r = loader_->zeEventHostSynchronize(event_, UINT64_MAX);
    if (r != ZE_RESULT_SUCCESS) spdlog::error("level_zero: a done event: zeEventHostSynchronize: {}", ZeLoader::ResultName(r));
    complete_ = true;
  }

 private:
  const ZeLoader* const loader_;
  ContextState* const state_;
  const ze_event_handle_t event_;
  bool complete_ = false;
};

// A fence with nothing to wait for: host order.
class CompleteFence final : public DoneFence {
 public:
  bool Complete() override { return true; }
  void Wait() override {}
};

absl::Status HostWait(const ZeLoader& loader, ze_event_handle_t event, const std::string& what) {
  const auto limit = std::chrono::duration_cast<std::chrono::nanoseconds>(kZeHostWaitLimit);
  ze_result_t r = loader.zeEventHostSynchronize(event, static_cast<uint64_t>(limit.count()));
  if (r == ZE_RESULT_NOT_READY) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": not signalled within ", kZeHostWaitLimit.count(),
                                                    " s (its producer's command list has not run; pass your "
                                                    "command list as the stream to wait on the device instead)"));
  }
  return ZeLoader::ZeStatus(r, absl::StrCat(what, ": zeEventHostSynchronize"));
}

auto AsList(uintptr_t stream) { return reinterpret_cast<ze_command_list_handle_t>(stream); }

}  // namespace

ZeRegionOrder::ZeRegionOrder(const ZeLoader* loader, ze_context_handle_t context, ze_device_handle_t device,
                             std::string uuid, ze_event_handle_t ready)
    : loader_(loader), context_(context), device_(device), uuid_(std::move(uuid)), ready_(ready) {}

ZeRegionOrder::ZeRegionOrder(const ZeLoader* loader)
    : loader_(loader), context_(nullptr), device_(nullptr), ready_(nullptr) {}

absl::StatusOr<ZeRegionOrder::Where> ZeRegionOrder::Locate(int32_t ordinal, const std::string& what) const {
  if (device_ != nullptr) return Where{context_, device_};
  absl::StatusOr<const ZeDevice*> device = loader_->DeviceByOrdinal(ordinal);
  if (!device.ok()) return absl::Status(device.status().code(), absl::StrCat(what, ": ", device.status().message()));
  TENSORD_ASSIGN_OR_RETURN(ze_context_handle_t context, ZeProcessContexts::Get().For(*loader_, (*device)->driver));
  return Where{context, (*device)->device};
}

absl::StatusOr<std::string> ZeRegionOrder::RecordReady(int32_t ordinal, uintptr_t stream,
                                                       const std::string& what) const {
  if (ready_ == nullptr) {
    // No pool (a producer's own export): the producer's list must finish before the publish.
    if (IsZeHostStream(stream)) return std::string();
    TENSORD_ASSIGN_OR_RETURN(Where where, Locate(ordinal, what));
    ContextState& state = ContextState::For(*loader_, where.context);
    TENSORD_ASSIGN_OR_RETURN(ze_event_handle_t event, state.Take(what));
    absl::Status appended = ZeLoader::ZeStatus(loader_->zeCommandListAppendSignalEvent(AsList(stream), event),
                                               absl::StrCat(what, ": zeCommandListAppendSignalEvent"));
    absl::Status waited = appended.ok() ? HostWait(*loader_, event, what) : appended;
    if (waited.ok()) state.Put(event);  // a pending event is never reused
    if (!waited.ok()) return waited;
    return std::string();
  }
  // Published again (the same buffer): the earlier signal must not release new readers.
  const bool signalled = loader_->zeEventQueryStatus(ready_) == ZE_RESULT_SUCCESS;
  if (IsZeHostStream(stream)) {
    if (signalled) {
      TENSORD_RETURN_IF_ERROR(
          ZeLoader::ZeStatus(loader_->zeEventHostReset(ready_), absl::StrCat(what, ": zeEventHostReset")));
    }
    TENSORD_RETURN_IF_ERROR(
        ZeLoader::ZeStatus(loader_->zeEventHostSignal(ready_), absl::StrCat(what, ": zeEventHostSignal")));
  } else {
    if (signalled) {
      TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(loader_->zeCommandListAppendEventReset(AsList(stream), ready_),
                                                 absl::StrCat(what, ": zeCommandListAppendEventReset")));
    }
    TENSORD_RETURN_IF_ERROR(ZeLoader::ZeStatus(loader_->zeCommandListAppendSignalEvent(AsList(stream), ready_),
                                               absl::StrCat(what, ": zeCommandListAppendSignalEvent")));
  }
  return EncodeZeReadyFence(ZeReadyFence{uuid_, 0});
}

absl::Status ZeRegionOrder::WaitReady(const ReadyFence& fence, int32_t ordinal, uintptr_t stream,
                                      const std::string& what) const {
  (void)ordinal;
  absl::StatusOr<ZeReadyFence> decoded = DecodeZeReadyFence(fence.bytes);
  if (!decoded.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", decoded.status().message()));
  if (decoded->uuid != uuid_ || decoded->event_index != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the ready fence names event ", decoded->event_index,
                                                   " on ", FormatZeUuid(decoded->uuid), ", not this buffer's"));
  }
  // A producer's own view of an export has no pool, and signalled nothing to wait on.
  if (ready_ == nullptr) return absl::OkStatus();
  if (IsZeHostStream(stream)) return HostWait(*loader_, ready_, what);
  return ZeLoader::ZeStatus(loader_->zeCommandListAppendWaitOnEvents(AsList(stream), 1, const_cast<ze_event_handle_t*>(&ready_)),
                            absl::StrCat(what, ": zeCommandListAppendWaitOnEvents"));
}

absl::StatusOr<std::unique_ptr<DoneFence>> ZeRegionOrder::RecordDone(int32_t ordinal, uintptr_t stream,
                                                                     const std::string& what) const {
  if (IsZeHostStream(stream)) return std::make_unique<CompleteFence>();
  TENSORD_ASSIGN_OR_RETURN(Where where, Locate(ordinal, what));
  ContextState& state = ContextState::For(*loader_, where.context);
  TENSORD_ASSIGN_OR_RETURN(ze_event_handle_t event, state.Take(what));
  if (ze_result_t r = loader_->zeCommandListAppendSignalEvent(AsList(stream), event); r != ZE_RESULT_SUCCESS) {
    state.Put(event);
    return ZeLoader::ZeStatus(r, absl::StrCat(what, ": zeCommandListAppendSignalEvent"));
  }
  return std::make_unique<ZeDoneFence>(loader_, &state, event);
}

absl::Status ZeRegionOrder::CopyOnStream(void* dst, const void* src, uint64_t bytes, int32_t ordinal,
                                         uintptr_t stream, const std::string& what) const {
  if (!IsZeHostStream(stream)) {
    return ZeLoader::ZeStatus(
        loader_->zeCommandListAppendMemoryCopy(AsList(stream), dst, src, bytes, nullptr, 0, nullptr),
        absl::StrCat(what, ": zeCommandListAppendMemoryCopy"));
  }
  TENSORD_ASSIGN_OR_RETURN(Where where, Locate(ordinal, what));
  ContextState& state = ContextState::For(*loader_, where.context);
  TENSORD_ASSIGN_OR_RETURN(ze_event_handle_t done, state.Take(what));
  absl::Status copied;
  {
    absl::MutexLock lock(&state.list_mu);
    absl::StatusOr<ze_command_list_handle_t> list = state.HostList(where.device, what);
    copied = list.ok() ? ZeLoader::ZeStatus(loader_->zeCommandListAppendMemoryCopy(*list, dst, src, bytes, done, 0, nullptr),
                                            absl::StrCat(what, ": zeCommandListAppendMemoryCopy"))
                       : list.status();
  }
  if (copied.ok()) copied = HostWait(*loader_, done, what);
  if (copied.ok()) state.Put(done);
  return copied;
}

absl::Status ZeRegionOrder::CopyToHost(void*, const void*, uint64_t, int32_t, const std::string& what) const {
  return absl::UnimplementedError(
      absl::StrCat(what, ": level_zero memory cannot be staged through host memory in this version"));
}

absl::Status ZeRegionOrder::CopyFromHost(void*, const void*, uint64_t, int32_t, const std::string& what) const {
  return absl::UnimplementedError(
      absl::StrCat(what, ": level_zero memory cannot be staged through host memory in this version"));
}

}  // namespace tensord::common
