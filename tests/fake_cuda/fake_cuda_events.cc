// libtensord_fake_cuda.so: stream handles for test programs, events, event IPC handles and
// cuStreamWaitEvent (the model is described below, at "Events").
#include "tests/fake_cuda/fake_cuda_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

using fake_cuda::Current;
using fake_cuda::S;

extern "C" {

// Streams for test programs (CudaDriver resolves none of these): handles only, since work
// on a stream runs at once (see "Events").
CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  FAKE_ENTER("cuStreamCreate");
  (void)Flags;
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *phStream = reinterpret_cast<CUstream>(static_cast<uintptr_t>(0x100000 + S().next_serial++));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  FAKE_ENTER("cuStreamSynchronize");
  (void)hStream;
  return Current() == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

// ---- Events ----
//
// Streams are not modelled: work "runs" when it is enqueued, so an event is complete as
// soon as it is recorded, unless a test holds the streams (tensord_fake_cuda_hold_streams):
// then a recorded event stays pending until tensord_fake_cuda_finish_streams() completes
// every pending event of this process, as a GPU finishing its queued work would.
// Each process keeps its events' states in a memfd (one uint32 per slot: 0 complete or
// never recorded, 1 pending); an IPC event handle carries the exporter's pid, that memfd's
// fd number, the slot and a serial, and cuIpcOpenEventHandle maps the table through
// /proc/PID/fd/N, so a consumer's wait sees the producer's event state. cuStreamWaitEvent
// enqueues nothing: it logs (stream, exporter, slot, pending) for the test queries.
// Strict like the real driver: events need a current context; cuIpcGetEventHandle needs
// CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING; opening an event handle in its own
// process fails; cuStreamWaitEvent takes flags 0 only.

namespace {
constexpr uint32_t kEventSlots = 4096;
constexpr char kEventMagic[8] = {'T', 'D', 'F', 'A', 'K', 'E', 'V', 'T'};
struct EventIpcBytes {  // the fake's CUipcEventHandle layout
  char magic[8];
  int32_t pid;
  int32_t table_fd;
  uint32_t slot;
  uint32_t pad;
  uint64_t serial;
};
static_assert(sizeof(EventIpcBytes) <= CU_IPC_HANDLE_SIZE);

CUresult EnsureEventTable() {
  if (S().event_table != nullptr) return CUDA_SUCCESS;
  int fd = ::memfd_create("tensord-fake-cuda-events", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (::ftruncate(fd, kEventSlots * sizeof(uint32_t)) != 0) {
    ::close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* p = ::mmap(nullptr, kEventSlots * sizeof(uint32_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  S().event_table_fd = fd;
  S().event_table = static_cast<volatile uint32_t*>(p);
  return CUDA_SUCCESS;
}
}  // namespace

CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  FAKE_ENTER("cuEventCreate");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = EnsureEventTable(); r != CUDA_SUCCESS) return r;
  uint32_t slot;
  if (!S().free_slots.empty()) {
    slot = S().free_slots.back();
    S().free_slots.pop_back();
  } else if (S().next_slot < kEventSlots) {
    slot = S().next_slot++;
  } else {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  S().event_table[slot] = 0;
  auto* ev = new CUevent_st();
  ev->flags = Flags;
  ev->slot = slot;
  ev->serial = S().next_serial++;
  ev->table = S().event_table;
  ++S().live_events;
  *phEvent = ev;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  FAKE_ENTER("cuEventRecord");
  (void)hStream;
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (hEvent == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  hEvent->table[hEvent->slot] = S().hold_streams ? 1u : 0u;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  FAKE_ENTER("cuEventQuery");
  if (hEvent == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return hEvent->table[hEvent->slot] == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  {
    FAKE_ENTER("cuEventSynchronize");
    if (hEvent == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  }
  // Held work finishes when the test says so: wait for it (without the lock), at most 30 s.
  for (int i = 0; i < 30000; ++i) {
    if (hEvent->table[hEvent->slot] == 0) return CUDA_SUCCESS;
    ::usleep(1000);
  }
  return CUDA_ERROR_LAUNCH_TIMEOUT;
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  FAKE_ENTER("cuEventDestroy_v2");
  if (hEvent == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (hEvent->exporter_pid != 0) {
    ::munmap(const_cast<uint32_t*>(hEvent->table), kEventSlots * sizeof(uint32_t));
  } else {
    hEvent->table[hEvent->slot] = 0;
    S().free_slots.push_back(hEvent->slot);
  }
  delete hEvent;
  --S().live_events;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle* pHandle, CUevent event) {
  FAKE_ENTER("cuIpcGetEventHandle");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (pHandle == nullptr || event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned int needed = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
  if ((event->flags & needed) != needed || event->exporter_pid != 0) return CUDA_ERROR_INVALID_VALUE;
  EventIpcBytes b{};
  std::memcpy(b.magic, kEventMagic, sizeof(b.magic));
  b.pid = static_cast<int32_t>(::getpid());
  b.table_fd = S().event_table_fd;
  b.slot = event->slot;
  b.serial = event->serial;
  std::memset(pHandle->reserved, 0, sizeof(pHandle->reserved));
  std::memcpy(pHandle->reserved, &b, sizeof(b));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcOpenEventHandle(CUevent* phEvent, CUipcEventHandle handle) {
  FAKE_ENTER("cuIpcOpenEventHandle");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
  EventIpcBytes b;
  std::memcpy(&b, handle.reserved, sizeof(b));
  if (std::memcmp(b.magic, kEventMagic, sizeof(b.magic)) != 0 || b.slot >= kEventSlots) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (b.pid == ::getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // not in the exporting process
  std::string path = "/proc/" + std::to_string(b.pid) + "/fd/" + std::to_string(b.table_fd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the exporter is gone
  void* p = ::mmap(nullptr, kEventSlots * sizeof(uint32_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_INVALID_HANDLE;
  auto* ev = new CUevent_st();
  ev->flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
  ev->slot = b.slot;
  ev->serial = b.serial;
  ev->exporter_pid = b.pid;
  ev->table = static_cast<volatile uint32_t*>(p);
  ++S().live_events;
  *phEvent = ev;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  FAKE_ENTER("cuStreamWaitEvent");
  if (Current() == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (hEvent == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  S().waits.push_back({reinterpret_cast<uintptr_t>(hStream), hEvent->exporter_pid, hEvent->slot,
                       hEvent->table[hEvent->slot] != 0});
  return CUDA_SUCCESS;
}

}  // extern "C"
