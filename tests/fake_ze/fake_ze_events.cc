// libtensord_fake_ze.so: event pools and events. A pool's event states are one lock-free
// std::atomic_ref<uint32_t> word each, in a memfd for ZE_EVENT_POOL_FLAG_IPC pools (its IPC
// handle names that fd; see fake_ze.h for the bytes) and in anonymous memory otherwise.
#include <level_zero/ze_ddi.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "tests/fake_ze/fake_ze.h"

namespace fake_ze {
namespace {

#define FAKE_ZE_CHECK_POOL(h)                                     \
  if ((h) == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE; \
  if (!state.pools.Has(h)) return ZE_RESULT_ERROR_INVALID_ARGUMENT

#define FAKE_ZE_CHECK_EVENT(h)                                    \
  if ((h) == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE; \
  if (!state.events.Has(h)) return ZE_RESULT_ERROR_INVALID_ARGUMENT

size_t StatesLength(uint32_t count) {
  return RoundUp(size_t{count} * sizeof(uint32_t), PageSize());
}

}  // namespace

ze_result_t ZE_APICALL zeEventPoolCreate(ze_context_handle_t hContext,
                                         const ze_event_pool_desc_t* desc, uint32_t numDevices,
                                         ze_device_handle_t* phDevices,
                                         ze_event_pool_handle_t* phEventPool) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  if (desc == nullptr || phEventPool == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->flags > 0x7) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  if (desc->count == 0 || (phDevices == nullptr && numDevices > 0)) {
    return ZE_RESULT_ERROR_INVALID_SIZE;
  }
  for (uint32_t i = 0; i < numDevices; ++i) {
    FAKE_ZE_CHECK_DEVICE(phDevices[i]);
  }
  // The spec: timestamps "cannot be combined with ZE_EVENT_POOL_FLAG_IPC".
  if ((desc->flags & ZE_EVENT_POOL_FLAG_IPC) != 0 &&
      (desc->flags & ZE_EVENT_POOL_FLAG_KERNEL_TIMESTAMP) != 0) {
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  auto states = std::make_shared<EventStates>();
  states->count = desc->count;
  const size_t length = StatesLength(desc->count);
  if ((desc->flags & ZE_EVENT_POOL_FLAG_IPC) != 0) {
    states->fd = NewMemfd("tensord-fake-ze-events", length);
    if (states->fd.get() < 0) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  states->mapping = MapAligned(states->fd.get(), length, 0);  // zero-filled: unsignalled
  if (!states->mapping) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  auto pool = std::make_unique<_ze_event_pool_handle_t>();
  pool->context = hContext;
  pool->flags = desc->flags;
  pool->states = std::move(states);
  pool->index_used.assign(desc->count, false);
  *phEventPool = state.pools.Add(std::move(pool));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeEventPoolDestroy(ze_event_pool_handle_t hEventPool) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_POOL(hEventPool);
  // An opened pool goes back with zeEventPoolCloseIpcHandle.
  if (hEventPool->imported) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  // The spec: "must destroy all event handles created from the pool" first.
  if (hEventPool->live_events != 0) return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
  state.pools.Take(hEventPool);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeEventPoolGetIpcHandle(ze_event_pool_handle_t hEventPool,
                                               ze_ipc_event_pool_handle_t* phIpc) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_POOL(hEventPool);
  if (phIpc == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  // Intel's driver answers UNSUPPORTED_FEATURE for a pool that is not shareable.
  if (hEventPool->imported || (hEventPool->flags & ZE_EVENT_POOL_FLAG_IPC) == 0) {
    return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
  }
  *phIpc = ze_ipc_event_pool_handle_t{};
  char* data = phIpc->data;
  StoreU64(data, static_cast<uint64_t>(hEventPool->states->fd.get()));  // ours: not to close
  StoreU32(data + 8, hEventPool->states->count);
  std::memcpy(data + 12, kPoolMagic, sizeof(kPoolMagic));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeEventPoolOpenIpcHandle(ze_context_handle_t hContext,
                                                ze_ipc_event_pool_handle_t hIpc,
                                                ze_event_pool_handle_t* phEventPool) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_CONTEXT(hContext);
  if (phEventPool == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  const char* data = hIpc.data;
  const uint64_t fd = LoadU64(data);
  const uint32_t count = LoadU32(data + 8);
  if (std::memcmp(data + 12, kPoolMagic, sizeof(kPoolMagic)) != 0 || count == 0 || fd > INT_MAX ||
      !IsMemfdOfAtLeast(static_cast<int>(fd), size_t{count} * sizeof(uint32_t))) {
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  // Mapped, not kept: the caller may close its fd after the call.
  auto states = std::make_shared<EventStates>();
  states->count = count;
  states->mapping = MapAligned(static_cast<int>(fd), StatesLength(count), 0);
  if (!states->mapping) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  auto pool = std::make_unique<_ze_event_pool_handle_t>();
  pool->context = hContext;
  pool->flags = ZE_EVENT_POOL_FLAG_IPC | ZE_EVENT_POOL_FLAG_HOST_VISIBLE;
  pool->imported = true;
  pool->states = std::move(states);
  pool->index_used.assign(count, false);
  *phEventPool = state.pools.Add(std::move(pool));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeEventPoolCloseIpcHandle(ze_event_pool_handle_t hEventPool) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_POOL(hEventPool);
  if (!hEventPool->imported) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (hEventPool->live_events != 0) return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
  state.pools.Take(hEventPool);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeEventCreate(ze_event_pool_handle_t hEventPool, const ze_event_desc_t* desc,
                                     ze_event_handle_t* phEvent) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_POOL(hEventPool);
  if (desc == nullptr || phEvent == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->signal > 0x7 || desc->wait > 0x7) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  // Strict on purpose: the spec leaves a slot already in use to the application.
  if (desc->index >= hEventPool->states->count || hEventPool->index_used[desc->index]) {
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  auto event = std::make_unique<_ze_event_handle_t>();
  event->pool = hEventPool;
  event->ref = EventRef{hEventPool->states, desc->index};
  // A new event starts unsignalled, except in an opened pool: as in Intel's driver, the
  // exporter may have signalled it before this process opened the pool.
  if (!hEventPool->imported) event->ref.Set(0);
  hEventPool->index_used[desc->index] = true;
  ++hEventPool->live_events;
  *phEvent = state.events.Add(std::move(event));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeEventDestroy(ze_event_handle_t hEvent) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_EVENT(hEvent);
  hEvent->pool->index_used[hEvent->ref.index] = false;
  --hEvent->pool->live_events;
  state.events.Take(hEvent);  // queued work waiting on or signalling it keeps its memory
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeEventHostSignal(ze_event_handle_t hEvent) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_EVENT(hEvent);
  hEvent->ref.Set(1);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeEventHostReset(ze_event_handle_t hEvent) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_EVENT(hEvent);
  hEvent->ref.Set(0);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeEventQueryStatus(ze_event_handle_t hEvent) {
  FAKE_ZE_ENTER();
  FAKE_ZE_CHECK_EVENT(hEvent);
  return hEvent->ref.Signalled() ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
}

ze_result_t ZE_APICALL zeEventHostSynchronize(ze_event_handle_t hEvent, uint64_t timeout) {
  EventRef ref;
  {
    FAKE_ZE_ENTER();
    FAKE_ZE_CHECK_EVENT(hEvent);
    ref = hEvent->ref;
  }
  // Polled without the lock: another thread (or process) signals meanwhile.
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (ref.Signalled()) return ZE_RESULT_SUCCESS;
    if (timeout != UINT64_MAX) {
      const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now() - start);
      if (static_cast<uint64_t>(elapsed.count()) >= timeout) return ZE_RESULT_NOT_READY;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace fake_ze

extern "C" {

ZE_DLLEXPORT ze_result_t ZE_APICALL
zeGetEventPoolProcAddrTable(ze_api_version_t version, ze_event_pool_dditable_t* pDdiTable) {
  if (ze_result_t r = fake_ze::StartTable(version, pDdiTable); r != ZE_RESULT_SUCCESS) return r;
  pDdiTable->pfnCreate = fake_ze::zeEventPoolCreate;
  pDdiTable->pfnDestroy = fake_ze::zeEventPoolDestroy;
  pDdiTable->pfnGetIpcHandle = fake_ze::zeEventPoolGetIpcHandle;
  pDdiTable->pfnOpenIpcHandle = fake_ze::zeEventPoolOpenIpcHandle;
  pDdiTable->pfnCloseIpcHandle = fake_ze::zeEventPoolCloseIpcHandle;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetEventProcAddrTable(ze_api_version_t version,
                                                            ze_event_dditable_t* pDdiTable) {
  if (ze_result_t r = fake_ze::StartTable(version, pDdiTable); r != ZE_RESULT_SUCCESS) return r;
  pDdiTable->pfnCreate = fake_ze::zeEventCreate;
  pDdiTable->pfnDestroy = fake_ze::zeEventDestroy;
  pDdiTable->pfnHostSignal = fake_ze::zeEventHostSignal;
  pDdiTable->pfnHostSynchronize = fake_ze::zeEventHostSynchronize;
  pDdiTable->pfnQueryStatus = fake_ze::zeEventQueryStatus;
  pDdiTable->pfnHostReset = fake_ze::zeEventHostReset;
  return ZE_RESULT_SUCCESS;
}

}  // extern "C"
