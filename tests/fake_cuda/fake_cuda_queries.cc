// libtensord_fake_cuda.so: the test-only queries (tensord_fake_cuda_*, looked up with dlsym):
// live objects, primary context retains, calls made, fault injection and stream order.
#include "tests/fake_cuda/fake_cuda_state.h"

#include <cstdint>
#include <string>

using fake_cuda::LiveHostRegistrationsLocked;
using fake_cuda::S;
using fake_cuda::State;
using fake_cuda::ValidOrdinal;

extern "C" {

// ---- Test-only queries ----

// Objects the fake holds for this process: live allocations (handles, or released ones
// still mapped), address reservations, mappings, cuMemAlloc'ed blocks and open IPC
// handles, host ranges registered with cuMemHostRegister, events (created or opened).
// `kind` null: all of them; else one of "allocation", "reservation", "mapping", "alloc",
// "ipc_open", "host_register", "event" (-1 for anything else).
__attribute__((visibility("default"))) int tensord_fake_cuda_live_objects(const char* kind) {
  std::lock_guard<std::mutex> lock(S().mu);
  auto n = [](size_t v) { return static_cast<int>(v); };
  if (kind == nullptr) {
    return n(S().allocations.size() + S().reservations.size() + S().mappings.size() + S().allocs.size() +
             S().opens.size()) + LiveHostRegistrationsLocked() + S().live_events;
  }
  std::string k = kind;
  if (k == "allocation") return n(S().allocations.size());
  if (k == "reservation") return n(S().reservations.size());
  if (k == "mapping") return n(S().mappings.size());
  if (k == "alloc") return n(S().allocs.size());
  if (k == "ipc_open") return n(S().opens.size());
  if (k == "host_register") return LiveHostRegistrationsLocked();
  if (k == "event") return S().live_events;
  return -1;
}

// How many times ordinal `ordinal`'s primary context is retained now (-1: no such device).
__attribute__((visibility("default"))) int tensord_fake_cuda_primary_context_retains(int ordinal) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (!ValidOrdinal(ordinal)) return -1;
  return S().contexts[ordinal].retains;
}

// How many times this process called entry point `symbol` (its exported name) after its
// cuInit, counting calls that failed too; 0 for one never called.
__attribute__((visibility("default"))) int tensord_fake_cuda_calls(const char* symbol) {
  std::lock_guard<std::mutex> lock(S().mu);
  auto it = S().calls.find(symbol);
  return it == S().calls.end() ? 0 : it->second;
}

// The next call of entry point `symbol` (its exported name) answers `result`.
__attribute__((visibility("default"))) void tensord_fake_cuda_fail_next(const char* symbol, int result) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().fail_next[symbol] = static_cast<CUresult>(result);
}

// While `hold` is non-zero, events this process records stay pending (its streams' work
// has not run) until tensord_fake_cuda_finish_streams().
__attribute__((visibility("default"))) void tensord_fake_cuda_hold_streams(int hold) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().hold_streams = hold != 0;
}

// Completes every pending event of this process; returns how many were pending.
__attribute__((visibility("default"))) int tensord_fake_cuda_finish_streams() {
  std::lock_guard<std::mutex> lock(S().mu);
  int finished = 0;
  for (uint32_t slot = 0; S().event_table != nullptr && slot < S().next_slot; ++slot) {
    if (S().event_table[slot] != 0) {
      S().event_table[slot] = 0;
      ++finished;
    }
  }
  return finished;
}

// How many cuStreamWaitEvent calls made `stream` wait on an event exported by process
// `exporter_pid` (0: this process's own events; -1: any), counting only waits on an event
// that was still pending when `pending_only` is non-zero.
__attribute__((visibility("default"))) int tensord_fake_cuda_stream_waits(uintptr_t stream, int exporter_pid,
                                                                          int pending_only) {
  std::lock_guard<std::mutex> lock(S().mu);
  int n = 0;
  for (const State::Wait& w : S().waits) {
    if (w.stream != stream) continue;
    if (exporter_pid != -1 && w.exporter_pid != exporter_pid) continue;
    if (pending_only != 0 && !w.pending) continue;
    ++n;
  }
  return n;
}

}  // extern "C"
