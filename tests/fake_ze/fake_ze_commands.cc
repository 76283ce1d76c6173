// libtensord_fake_ze.so: command lists and queues. An immediate list and a queue each own
// a Worker thread that runs commands in order, asynchronously to the caller; a regular
// list records commands until a queue runs them. Waits poll the events' states, so an
// event signalled by another process (through an opened IPC pool) releases them too.
//
// Strict on purpose, as the spec asks of the application: a command's events and memory
// must belong to the list's context (memory: allocations of that context, IPC handles
// opened in it, or host memory the driver did not hand out); a copy or fill must stay
// inside the allocation it starts in.
#include <level_zero/ze_ddi.h>

#include <algorithm>
#include <cstring>

#include "tests/fake_ze/fake_ze.h"

namespace fake_ze {

Worker::Worker() : thread_([this] { Run(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();  // after the queue drains: a command stalled on an event stalls this too
}

void Worker::Push(std::vector<Op> ops) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Op& op : ops) queue_.push_back(std::move(op));
  }
  work_cv_.notify_all();
}

bool Worker::WaitIdle(uint64_t timeout_ns) {
  std::unique_lock<std::mutex> lock(mu_);
  auto idle = [this] { return queue_.empty() && !busy_; };
  if (timeout_ns == UINT64_MAX) {
    idle_cv_.wait(lock, idle);
    return true;
  }
  // Capped so that now() + timeout cannot overflow (1e18 ns is 31 years).
  const auto timeout =
      std::chrono::nanoseconds(std::min<uint64_t>(timeout_ns, 1'000'000'000'000'000'000ull));
  return idle_cv_.wait_for(lock, timeout, idle);
}

void Worker::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and drained
    Op op = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    for (const EventRef& wait : op.waits) {
      while (!wait.Signalled()) std::this_thread::sleep_for(kPollInterval);
    }
    if (op.work) op.work();
    // Memory let go before the signal: once the caller sees it, memory it freed meanwhile
    // is unmapped (and a device allocation's memfd closed).
    op.keep.clear();
    for (const EventRef& signal : op.signals) signal.Set(1);
    op = Op();
    lock.lock();
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

namespace {

#define FAKE_ZE_CHECK_LIST(h)                                     \
  if ((h) == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE; \
  if (!state.lists.Has(h)) return ZE_RESULT_ERROR_INVALID_ARGUMENT

#define FAKE_ZE_CHECK_QUEUE(h)                                    \
  if ((h) == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE; \
  if (!state.queues.Has(h)) return ZE_RESULT_ERROR_INVALID_ARGUMENT

#define FAKE_ZE_RETURN_IF_ERROR(expr) \
  if (ze_result_t result_ = (expr); result_ != ZE_RESULT_SUCCESS) return result_

// A list that can take a command: a closed regular list cannot.
ze_result_t CheckOpen(ze_command_list_handle_t list) {
  return !list->immediate && list->closed ? ZE_RESULT_ERROR_INVALID_ARGUMENT : ZE_RESULT_SUCCESS;
}

// Adds `event` (an event of the list's context) to `out`.
ze_result_t AddEvent(const State& state, ze_command_list_handle_t list, ze_event_handle_t event,
                     std::vector<EventRef>* out) {
  if (event == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!state.events.Has(event)) return ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT;
  if (event->pool->context != list->context) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  out->push_back(event->ref);
  return ZE_RESULT_SUCCESS;
}

// The optional signal event and wait list most appends take.
ze_result_t AddEvents(const State& state, ze_command_list_handle_t list, ze_event_handle_t signal,
                      uint32_t num_waits, ze_event_handle_t* waits, Op* op) {
  if (num_waits > 0 && waits == nullptr) return ZE_RESULT_ERROR_INVALID_SIZE;
  for (uint32_t i = 0; i < num_waits; ++i) {
    FAKE_ZE_RETURN_IF_ERROR(AddEvent(state, list, waits[i], &op->waits));
  }
  if (signal != nullptr) FAKE_ZE_RETURN_IF_ERROR(AddEvent(state, list, signal, &op->signals));
  return ZE_RESULT_SUCCESS;
}

// Whether the list's device may touch [ptr, ptr + size); keeps the region it lies in
// mapped for the command.
ze_result_t CheckAccess(const State& state, ze_command_list_handle_t list, const void* ptr,
                        size_t size, Op* op) {
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  std::shared_ptr<Region> region = state.Find(ptr);
  if (region == nullptr) {
    // Host memory the driver did not hand out (malloc, the stack): fine, unless the range
    // runs on into memory it did.
    auto next = state.regions.upper_bound(begin);
    if (next != state.regions.end() && next->first - begin < size) {
      return ZE_RESULT_ERROR_INVALID_SIZE;
    }
    return ZE_RESULT_SUCCESS;
  }
  if (region->context != list->context) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  const size_t offset = begin - reinterpret_cast<uintptr_t>(region->base());
  if (size > region->size - offset) return ZE_RESULT_ERROR_INVALID_SIZE;
  op->keep.push_back(std::move(region));
  return ZE_RESULT_SUCCESS;
}

// Records `op` on a regular list, or runs it on an immediate one's worker (returning once
// it has run for a synchronous one). Releases the state lock for the latter.
ze_result_t Submit(ze_command_list_handle_t list, Op op, std::unique_lock<std::mutex>& lock) {
  if (!list->immediate) {
    list->ops.push_back(std::move(op));
    return ZE_RESULT_SUCCESS;
  }
  Worker* worker = list->worker.get();
  const bool synchronous = list->synchronous;
  lock.unlock();
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  worker->Push(std::move(ops));
  if (synchronous) worker->WaitIdle(UINT64_MAX);
  return ZE_RESULT_SUCCESS;
}

// The checks zeCommandQueueCreate and zeCommandListCreateImmediate share: one group
// (ordinal 0) of one queue (index 0).
ze_result_t CheckQueueDesc(const ze_command_queue_desc_t& desc) {
  if (desc.flags > ZE_COMMAND_QUEUE_FLAG_EXPLICIT_ONLY ||
      desc.mode > ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS ||
      desc.priority > ZE_COMMAND_QUEUE_PRIORITY_PRIORITY_HIGH) {
    return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  }
  if (desc.ordinal != 0 || desc.index != 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  return ZE_RESULT_SUCCESS;
}

}  // namespace

// ---- Command lists ----------------------------------------------------------------------

ze_result_t ZE_APICALL zeCommandListCreate(ze_context_handle_t hContext, ze_device_handle_t hDevice,
                                           const ze_command_list_desc_t* desc,
                                           ze_command_list_handle_t* phCommandList) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  FAKE_ZE_CHECK_DEVICE(hDevice);
  if (desc == nullptr || phCommandList == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->flags > 0x7) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  if (desc->commandQueueGroupOrdinal != 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  auto list = std::make_unique<_ze_command_list_handle_t>();
  list->context = hContext;
  list->device = hDevice;
  *phCommandList = state.lists.Add(std::move(list));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeCommandListCreateImmediate(ze_context_handle_t hContext,
                                                    ze_device_handle_t hDevice,
                                                    const ze_command_queue_desc_t* altdesc,
                                                    ze_command_list_handle_t* phCommandList) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  FAKE_ZE_CHECK_DEVICE(hDevice);
  if (altdesc == nullptr || phCommandList == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  FAKE_ZE_RETURN_IF_ERROR(CheckQueueDesc(*altdesc));
  auto list = std::make_unique<_ze_command_list_handle_t>();
  list->context = hContext;
  list->device = hDevice;
  list->immediate = true;
  list->synchronous = altdesc->mode == ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS;
  list->worker = std::make_unique<Worker>();
  *phCommandList = state.lists.Add(std::move(list));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeCommandListDestroy(ze_command_list_handle_t hCommandList) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_LIST(hCommandList);
  std::unique_ptr<_ze_command_list_handle_t> list = state.lists.Take(hCommandList);
  // Drained without the lock: its commands may wait on events this process signals.
  lock.unlock();
  list.reset();
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeCommandListClose(ze_command_list_handle_t hCommandList) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_LIST(hCommandList);
  if (!hCommandList->immediate) hCommandList->closed = true;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeCommandListReset(ze_command_list_handle_t hCommandList) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_LIST(hCommandList);
  if (hCommandList->immediate) {
    Worker* worker = hCommandList->worker.get();
    lock.unlock();
    worker->WaitIdle(UINT64_MAX);
    return ZE_RESULT_SUCCESS;
  }
  hCommandList->ops.clear();
  hCommandList->closed = false;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeCommandListAppendMemoryCopy(ze_command_list_handle_t hCommandList,
                                                     void* dstptr, const void* srcptr, size_t size,
                                                     ze_event_handle_t hSignalEvent,
                                                     uint32_t numWaitEvents,
                                                     ze_event_handle_t* phWaitEvents) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_LIST(hCommandList);
  if (dstptr == nullptr || srcptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  FAKE_ZE_RETURN_IF_ERROR(CheckOpen(hCommandList));
  Op op;
  FAKE_ZE_RETURN_IF_ERROR(
      AddEvents(state, hCommandList, hSignalEvent, numWaitEvents, phWaitEvents, &op));
  FAKE_ZE_RETURN_IF_ERROR(CheckAccess(state, hCommandList, dstptr, size, &op));
  FAKE_ZE_RETURN_IF_ERROR(CheckAccess(state, hCommandList, srcptr, size, &op));
  op.work = [dstptr, srcptr, size] { std::memmove(dstptr, srcptr, size); };
  return Submit(hCommandList, std::move(op), lock);
}

ze_result_t ZE_APICALL zeCommandListAppendMemoryFill(ze_command_list_handle_t hCommandList,
                                                     void* ptr, const void* pattern,
                                                     size_t pattern_size, size_t size,
                                                     ze_event_handle_t hSignalEvent,
                                                     uint32_t numWaitEvents,
                                                     ze_event_handle_t* phWaitEvents) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_LIST(hCommandList);
  if (ptr == nullptr || pattern == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  // The spec: a power of two, at most maxMemoryFillPatternSize.
  if (pattern_size == 0 || (pattern_size & (pattern_size - 1)) != 0 ||
      pattern_size > kMaxFillPatternSize) {
    return ZE_RESULT_ERROR_INVALID_SIZE;
  }
  FAKE_ZE_RETURN_IF_ERROR(CheckOpen(hCommandList));
  Op op;
  FAKE_ZE_RETURN_IF_ERROR(
      AddEvents(state, hCommandList, hSignalEvent, numWaitEvents, phWaitEvents, &op));
  FAKE_ZE_RETURN_IF_ERROR(CheckAccess(state, hCommandList, ptr, size, &op));
  // The pattern is read now: the caller may reuse its buffer once the append returns.
  std::vector<char> bytes(static_cast<const char*>(pattern),
                          static_cast<const char*>(pattern) + pattern_size);
  op.work = [ptr, size, bytes = std::move(bytes)] {
    auto* out = static_cast<char*>(ptr);
    for (size_t i = 0; i < size; ++i) out[i] = bytes[i % bytes.size()];
  };
  return Submit(hCommandList, std::move(op), lock);
}

ze_result_t ZE_APICALL zeCommandListAppendBarrier(ze_command_list_handle_t hCommandList,
                                                  ze_event_handle_t hSignalEvent,
                                                  uint32_t numWaitEvents,
                                                  ze_event_handle_t* phWaitEvents) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_LIST(hCommandList);
  FAKE_ZE_RETURN_IF_ERROR(CheckOpen(hCommandList));
  // Commands run one at a time, in order: the barrier only waits and signals.
  Op op;
  FAKE_ZE_RETURN_IF_ERROR(
      AddEvents(state, hCommandList, hSignalEvent, numWaitEvents, phWaitEvents, &op));
  return Submit(hCommandList, std::move(op), lock);
}

ze_result_t ZE_APICALL zeCommandListAppendSignalEvent(ze_command_list_handle_t hCommandList,
                                                      ze_event_handle_t hEvent) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_LIST(hCommandList);
  FAKE_ZE_RETURN_IF_ERROR(CheckOpen(hCommandList));
  Op op;
  FAKE_ZE_RETURN_IF_ERROR(AddEvent(state, hCommandList, hEvent, &op.signals));
  return Submit(hCommandList, std::move(op), lock);
}

ze_result_t ZE_APICALL zeCommandListAppendWaitOnEvents(ze_command_list_handle_t hCommandList,
                                                       uint32_t numEvents,
                                                       ze_event_handle_t* phEvents) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_LIST(hCommandList);
  if (phEvents == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  FAKE_ZE_RETURN_IF_ERROR(CheckOpen(hCommandList));
  Op op;
  FAKE_ZE_RETURN_IF_ERROR(AddEvents(state, hCommandList, nullptr, numEvents, phEvents, &op));
  return Submit(hCommandList, std::move(op), lock);
}

ze_result_t ZE_APICALL zeCommandListAppendEventReset(ze_command_list_handle_t hCommandList,
                                                     ze_event_handle_t hEvent) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_LIST(hCommandList);
  FAKE_ZE_RETURN_IF_ERROR(CheckOpen(hCommandList));
  std::vector<EventRef> events;
  FAKE_ZE_RETURN_IF_ERROR(AddEvent(state, hCommandList, hEvent, &events));
  Op op;
  op.work = [event = events.front()] { event.Set(0); };
  return Submit(hCommandList, std::move(op), lock);
}

// ---- Command queues ---------------------------------------------------------------------

ze_result_t ZE_APICALL zeCommandQueueCreate(ze_context_handle_t hContext,
                                            ze_device_handle_t hDevice,
                                            const ze_command_queue_desc_t* desc,
                                            ze_command_queue_handle_t* phCommandQueue) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  FAKE_ZE_CHECK_DEVICE(hDevice);
  if (desc == nullptr || phCommandQueue == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  FAKE_ZE_RETURN_IF_ERROR(CheckQueueDesc(*desc));
  auto queue = std::make_unique<_ze_command_queue_handle_t>();
  queue->context = hContext;
  queue->device = hDevice;
  queue->synchronous = desc->mode == ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS;
  queue->worker = std::make_unique<Worker>();
  *phCommandQueue = state.queues.Add(std::move(queue));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeCommandQueueDestroy(ze_command_queue_handle_t hCommandQueue) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_QUEUE(hCommandQueue);
  std::unique_ptr<_ze_command_queue_handle_t> queue = state.queues.Take(hCommandQueue);
  lock.unlock();
  queue.reset();  // drains first, as zeCommandListDestroy
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeCommandQueueExecuteCommandLists(ze_command_queue_handle_t hCommandQueue,
                                                         uint32_t numCommandLists,
                                                         ze_command_list_handle_t* phCommandLists,
                                                         ze_fence_handle_t hFence) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_QUEUE(hCommandQueue);
  if (phCommandLists == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (numCommandLists == 0) return ZE_RESULT_ERROR_INVALID_SIZE;
  if (hFence != nullptr) return ZE_RESULT_ERROR_INVALID_ARGUMENT;  // the fake has no fences
  std::vector<Op> ops;
  for (uint32_t i = 0; i < numCommandLists; ++i) {
    ze_command_list_handle_t list = phCommandLists[i];
    FAKE_ZE_CHECK_LIST(list);
    if (list->immediate) return ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE;
    if (!list->closed || list->context != hCommandQueue->context ||
        list->device != hCommandQueue->device) {
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    ops.insert(ops.end(), list->ops.begin(), list->ops.end());  // a list may run again
  }
  Worker* worker = hCommandQueue->worker.get();
  const bool synchronous = hCommandQueue->synchronous;
  lock.unlock();
  worker->Push(std::move(ops));
  if (synchronous) worker->WaitIdle(UINT64_MAX);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeCommandQueueSynchronize(ze_command_queue_handle_t hCommandQueue,
                                                 uint64_t timeout) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_QUEUE(hCommandQueue);
  Worker* worker = hCommandQueue->worker.get();
  lock.unlock();
  return worker->WaitIdle(timeout) ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
}

}  // namespace fake_ze

extern "C" {

ZE_DLLEXPORT ze_result_t ZE_APICALL
zeGetCommandListProcAddrTable(ze_api_version_t version, ze_command_list_dditable_t* pDdiTable) {
  if (ze_result_t r = fake_ze::StartTable(version, pDdiTable); r != ZE_RESULT_SUCCESS) return r;
  pDdiTable->pfnCreate = fake_ze::zeCommandListCreate;
  pDdiTable->pfnCreateImmediate = fake_ze::zeCommandListCreateImmediate;
  pDdiTable->pfnDestroy = fake_ze::zeCommandListDestroy;
  pDdiTable->pfnClose = fake_ze::zeCommandListClose;
  pDdiTable->pfnReset = fake_ze::zeCommandListReset;
  pDdiTable->pfnAppendBarrier = fake_ze::zeCommandListAppendBarrier;
  pDdiTable->pfnAppendMemoryCopy = fake_ze::zeCommandListAppendMemoryCopy;
  pDdiTable->pfnAppendMemoryFill = fake_ze::zeCommandListAppendMemoryFill;
  pDdiTable->pfnAppendSignalEvent = fake_ze::zeCommandListAppendSignalEvent;
  pDdiTable->pfnAppendWaitOnEvents = fake_ze::zeCommandListAppendWaitOnEvents;
  pDdiTable->pfnAppendEventReset = fake_ze::zeCommandListAppendEventReset;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL
zeGetCommandQueueProcAddrTable(ze_api_version_t version, ze_command_queue_dditable_t* pDdiTable) {
  if (ze_result_t r = fake_ze::StartTable(version, pDdiTable); r != ZE_RESULT_SUCCESS) return r;
  pDdiTable->pfnCreate = fake_ze::zeCommandQueueCreate;
  pDdiTable->pfnDestroy = fake_ze::zeCommandQueueDestroy;
  pDdiTable->pfnExecuteCommandLists = fake_ze::zeCommandQueueExecuteCommandLists;
  pDdiTable->pfnSynchronize = fake_ze::zeCommandQueueSynchronize;
  return ZE_RESULT_SUCCESS;
}

}  // extern "C"
