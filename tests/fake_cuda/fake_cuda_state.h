// libtensord_fake_cuda.so: a SOFTWARE STAND-IN for libcuda.so.1, for tests only. It
// proves tensord's plumbing (dlopen table, handle encoding, fd passing, UUID -> ordinal
// mapping, reserve/map/access/unmap ordering, refcounted IPC opens, cleanup) on machines
// without a GPU. It proves nothing about NVIDIA hardware or the real driver's behaviour:
// "device memory" is host memory in memfds. See README.md beside it.
//
// It implements exactly the entry points CudaDriver resolves (common/memory/cuda/
// cuda_driver.h), plus what a test producer needs (cuMemAlloc_v2, cuMemFree_v2) and
// test-only queries (tensord_fake_cuda_*), looked up with dlsym.
//
// Environment (read at cuInit):
//   TENSORD_FAKE_CUDA_DEVICES=N        physical devices (default 1; 0: cuInit answers
//                                      CUDA_ERROR_NO_DEVICE)
//   CUDA_VISIBLE_DEVICES=a,b,...       as the real driver: ordinals or GPU-<uuid prefix>;
//                                      the list stops at the first entry that names no
//                                      device; set but empty hides every device
//   TENSORD_FAKE_CUDA_NO_READ_ONLY=1   cuMemSetAccess refuses CU_MEM_ACCESS_FLAGS_PROT_READ
//                                      with CUDA_ERROR_INVALID_VALUE (a driver that cannot
//                                      map read-only)
//
// Modelled strictly, to catch ordering bugs: VMM calls and cuPointerGetAttribute need no
// context, legacy IPC, cuMemGetAddressRange and copies need a current one (for
// cuMemGetAddressRange and cuIpcGetMemHandle, one on the memory's device); cuMemSetAccess
// must name the allocation's own device (no peer access); cuMemAddressFree of a range that
// is still mapped fails; a second
// cuIpcOpenMemHandle of one allocation in one process answers CUDA_ERROR_ALREADY_MAPPED;
// opening a handle in its exporting process fails. Copies into a read-only mapping answer
// CUDA_ERROR_ILLEGAL_ADDRESS instead of faulting.
//
// This header holds the library's internals: the driver objects cuda.h leaves opaque
// (CUctx_st, CUevent_st), the process-wide state that every entry point works on, and the
// helpers that the entry point files share. None of it is exported (the namespace is
// hidden): the library exports the cu* entry points and the tensord_fake_cuda_* test
// queries, with C linkage, from
//   fake_cuda_device.cc         errors, cuInit, devices, primary contexts, the context stack
//   fake_cuda_vmm.cc            VMM: allocations, shareable handles, reservations, mappings
//   fake_cuda_memory.cc         copies, cuMemAlloc'ed memory, pointer queries, memory IPC
//   fake_cuda_events.cc         streams and events, event IPC, stream waits
//   fake_cuda_host_register.cc  pinned host memory
//   fake_cuda_queries.cc        the test-only queries
//
// Thread-safety: every entry point holds S().mu while it runs (FAKE_ENTER), and the helpers
// here that touch S() expect it held; the context stack is per thread.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

struct CUctx_st {
  int ordinal = 0;
  int physical = 0;
  int retains = 0;
};

// An event: a slot in a process's event table (see "Events" below). An imported one
// reads and writes the exporter's table through a shared mapping of it.
struct CUevent_st {
  unsigned int flags = 0;
  uint32_t slot = 0;
  uint64_t serial = 0;
  int exporter_pid = 0;          // 0: this process's own event
  volatile uint32_t* table = nullptr;  // the slot states this event lives in
};

namespace fake_cuda __attribute__((visibility("hidden"))) {

inline constexpr size_t kGranularity = 2u << 20;
inline constexpr int kMaxDevices = 16;
inline constexpr uint64_t kTotalMem = 16ull << 30;

struct Allocation {
  int fd = -1;
  size_t size = 0;
  int physical = 0;
  unsigned long long handle_types = 0;
  bool handle_live = true;  // false once cuMemRelease'd; mappings may keep it
  int mappings = 0;
};

struct Mapping {
  size_t size = 0;
  unsigned long long allocation = 0;
  CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
};

struct Linear {  // cuMemAlloc'ed memory or an opened IPC handle: mapped read-write
  int fd = -1;
  size_t size = 0;
  int physical = 0;
  uint64_t serial = 0;
  std::string ipc_key;  // opened IPC handle: exporter pid, fd and serial
};

struct State {
  std::mutex mu;
  bool initialized = false;
  int physical_count = 0;
  std::vector<int> visible;  // physical device by ordinal
  bool no_read_only = false;
  CUctx_st contexts[kMaxDevices];
  unsigned long long next_handle = 1;
  uint64_t next_serial = 1;
  std::map<unsigned long long, Allocation> allocations;
  std::map<uintptr_t, size_t> reservations;
  std::map<uintptr_t, Mapping> mappings;
  std::map<uintptr_t, Linear> allocs;  // cuMemAlloc
  std::map<uintptr_t, Linear> opens;   // cuIpcOpenMemHandle
  std::map<std::string, CUresult> fail_next;
  std::map<std::string, int> calls;  // entry point -> calls in this process (tensord_fake_cuda_calls)
  // Events (see "Events" below).
  int event_table_fd = -1;
  volatile uint32_t* event_table = nullptr;
  std::vector<uint32_t> free_slots;
  uint32_t next_slot = 0;
  int live_events = 0;
  bool hold_streams = false;
  struct Wait {
    uintptr_t stream;
    int exporter_pid;
    uint32_t slot;
    bool pending;
  };
  std::vector<Wait> waits;
};

// The process's state, made on first use and never destroyed.
State& S();

inline bool Initialized() { return S().initialized; }

inline bool ValidOrdinal(int ordinal) { return ordinal >= 0 && ordinal < static_cast<int>(S().visible.size()); }

// Counts a call of entry point `name` and answers the failure injected for it, if any
// (tensord_fake_cuda_fail_next), else CUDA_SUCCESS.
CUresult Injected(const char* name);

// The calling thread's current context (the top of its stack), or null.
CUctx_st* Current();

// The physical device of a memfd this fake made (from its name), or -1.
int PhysicalOfMemfd(int fd);

// A new memfd of `size` bytes for physical device `physical`, or -1.
int NewMemfd(int physical, size_t size);

// Registered host ranges (cuMemHostRegister_v2) now: fake_cuda_host_register.cc.
int LiveHostRegistrationsLocked();

}  // namespace fake_cuda

// The first statement of every entry point: takes the state's lock for the rest of the
// call, refuses calls before cuInit and answers an injected failure.
#define FAKE_ENTER(name)                                                 \
  std::lock_guard<std::mutex> lock(::fake_cuda::S().mu);                  \
  if (!::fake_cuda::Initialized()) return CUDA_ERROR_NOT_INITIALIZED;     \
  if (CUresult injected = ::fake_cuda::Injected(name); injected != CUDA_SUCCESS) return injected
