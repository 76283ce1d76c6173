// ExportTable: what a session keeps alive for its exports of memory its process owns (a
// device pointer exported by legacy CUDA IPC: the broker cannot hold that memory, so the
// producer must). Each export's `source` (the owner of the memory the user handed to
// ExportDevice) is recorded by tensor id once the broker registered it, and stays here
// until the broker pushes ExportReleased for it (the tensor is unbound and no lease on it
// is left), or until the session's owner takes it (see SessionHolder for a lost session and
// the Client's end).
//
// A source may be user code when dropped (a shared_ptr deleter, a Python decref): nothing
// here ever destroys one under the table's lock. Release() only moves a source to the
// released list; TakeReleased() / TakeHeld() hand sources out for the caller to drop after
// unlocking whatever it holds. A source still here when the table is destroyed is dropped
// then. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace tensord::internal {

class ExportTable {
 public:
  using Source = std::shared_ptr<const void>;

  // Records `source` for the export that is tensor `tensor_id` in buffer `buffer_id`.
  void Add(uint64_t tensor_id, uint64_t buffer_id, Source source);
  // The broker freed the export: its source moves to the released list. False when the
  // tensor is not here (a repeated notice, or one for a source-less export) or the buffer
  // differs (0 matches any).
  bool Release(uint64_t tensor_id, uint64_t buffer_id = 0);
  // Sources released since the last call, for the caller to drop.
  std::vector<Source> TakeReleased();
  // Every source still held (not released), for a session that is gone.
  std::vector<Source> TakeHeld();
  // Tensor ids of the exports still held.
  std::vector<uint64_t> HeldTensorIds() const;
  size_t held() const;

  // Notices may have been lost (a cache_reset): the owner asks the broker about each export
  // still held. TakeUnsure() answers whether that is owed, and clears it.
  void MarkUnsure();
  bool TakeUnsure();

 private:
  struct Entry {
    uint64_t buffer_id = 0;
    Source source;
  };

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> held_ ABSL_GUARDED_BY(mu_);  // by tensor id
  std::vector<Source> released_ ABSL_GUARDED_BY(mu_);
  bool unsure_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tensord::internal
