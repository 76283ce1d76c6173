// TensorRegistry: the broker's tensors, their buffers and the name bindings.
//
// A tensor lives while it is bound to a name, any lease holds it or a hand-over is pending
// for it (the broker drops it through Remove once none is true). A buffer lives while any tensor points into it.
// It keeps the running usage figures Status reports (UsageCounters): a registered tensor's
// namespace, layout and holders therefore change only through it (SetNamespaceAndLayout,
// AddHolder, RemoveHolder).
// Not thread-safe: the Broker guards it with its mutex.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/memory/memory_backend.h"
#include "common/tensor_desc.h"
#include "server/memory/arena.h"
#include "server/memory/backend_registry.h"
#include "server/state/usage_counters.h"
#include "tensord/v1/tensor.pb.h"

namespace tensord::server {

struct Buffer {
  uint64_t id = 0;
  std::unique_ptr<common::BackendBuffer> memory;
  const ResolvedDevice* device = nullptr;  // where it lives (BackendRegistry's, constant)
  uint64_t size = 0;
  absl::flat_hash_set<uint64_t> tensor_ids;  // tensors pointing into this buffer
  // Set for an arena. It lives while its owner session does (an empty arena is that
  // session's pool) and then until its last tensor goes; arena_owner is 0 once the owner closed.
  std::unique_ptr<ArenaSlots> arena;
  uint64_t arena_owner = 0;
  std::string arena_ns;
  // It passed its backend's CheckShareable at a publish (host: the reader seals). A seal
  // cannot be removed, so an arena's later publishes need not ask again.
  bool reader_sealed = false;
  // Allocated recyclable (AllocateRequest.recyclable granted): its producer keeps its
  // writable mapping until told RecycledBufferFreed, and when its tensor goes the buffer may
  // wait in the producer session's BufferPool for the next one.
  bool recyclable = false;
  // Recyclable only: the other sessions that fetched its handle. Their clients keep their
  // mappings for the producer's next tensor in it, and are told when it is freed.
  absl::flat_hash_set<uint64_t> readers;
  // Memory its producer owns (BackendBuffer::OwnedByProducer) whose producer exited: why
  // nothing may acquire or fetch it any more. Empty otherwise.
  std::string producer_exited;
};

struct Tensor {
  uint64_t id = 0;
  std::string ns;         // namespace from Allocate, or of the name once published
  std::string name;       // current binding; empty when unbound
  uint64_t generation = 0;
  tensord::v1::TensorDesc desc;
  common::TensorLayout layout;
  const ResolvedDevice* device = nullptr;  // where its memory lives (BackendRegistry's)
  uint64_t buffer_id = 0;  // 0: zero-byte tensor, no buffer
  uint64_t offset = 0;
  uint64_t slot_bytes = 0;  // in an arena: the slot's length, freed when the tensor goes
  tensord::v1::TensorState state = tensord::v1::TENSOR_STATE_CREATING;
  std::map<std::string, std::string> tags;
  int64_t created_unix_ms = 0;
  uint64_t producer_session = 0;
  uint32_t producer_uid = 0;
  // What the producer's uid is charged for this tensor (UidQuota): its metadata, and the
  // bytes of its dedicated buffer when outside an ACL'd namespace.
  uint64_t uid_metadata_bytes = 0;
  uint64_t uid_host_bytes = 0;
  uint32_t leases = 0;
  uint32_t hand_overs = 0;  // pending hand-overs (HandOverTable) holding it
  // Session id -> leases it holds here. Once registered: changed by TensorRegistry only.
  absl::flat_hash_map<uint64_t, uint32_t> holders;
  // Holders that acquired it by name: only they may cache the lease under that name, so
  // only they hear that it retired (a take's or a producer's lease is never cached).
  absl::flat_hash_set<uint64_t> name_holders;
  uint64_t ttl_timer = 0;  // pending TTL unbind, 0 when none
  int64_t ttl_deadline_unix_ms = 0;  // when that unbind is due (carried by a take-over)
  // The producer's ready fence from Publish (opaque); cleared when its session closes.
  std::string ready_fence;
  // Allocate only: the producer asked for a recyclable buffer (AllocateRequest.recyclable).
  bool recyclable_requested = false;
  // The bounded work queue whose slot it holds (QueueSlots), until it leaves the queue.
  std::string queue_prefix;
  // Published with unbind_on_exit: in its producer session's unbound_on_exit while bound.
  bool unbind_on_exit = false;
  // Published evictable: a copy the broker may unbind, while no lease holds it, to make
  // room for an allocation (Broker::EvictCopiesLocked).
  bool evictable = false;
};

class TensorRegistry {
 public:
  uint64_t NextTensorId() { return ++last_tensor_id_; }
  uint64_t NextBufferId() { return ++last_buffer_id_; }
  uint64_t NextGeneration() { return ++last_generation_; }
  uint64_t last_generation() const { return last_generation_; }
  // Generations continue after `generation` (a registry carried from another daemon).
  void ContinueGenerationsAfter(uint64_t generation) { last_generation_ = std::max(last_generation_, generation); }

  Tensor& AddTensor(Tensor tensor);
  // `buffer.id` is NextBufferId()'s, or a recycled buffer's own id again.
  void AddBuffer(Buffer buffer);
  Tensor* Find(uint64_t tensor_id);
  Buffer* FindBuffer(uint64_t buffer_id);
  // The tensor bound to `name`, or null.
  Tensor* FindByName(const std::string& name);
  // A bound name of `name`'s namespace a few edits away from it (a typo's likely target),
  // among the names next to it in order; nullopt when none is close. Bounded work, whatever
  // the number of names: a caller may ask on every miss.
  std::optional<std::string> NearestBoundName(std::string_view name) const;

  // Binds `name` to `tensor` (sets its name and generation) and returns the id of the
  // tensor that was bound before, or 0. The caller retires the old one.
  uint64_t Bind(const std::string& name, Tensor& tensor, uint64_t generation);
  // Removes the binding of `tensor` (if any); the tensor keeps its generation.
  void Unbind(Tensor& tensor);

  // A registered tensor gets its namespace and layout at publish.
  void SetNamespaceAndLayout(Tensor& tensor, std::string ns, common::TensorLayout layout);
  // One more lease of `session_id` on `tensor` (`by_name`: acquired by its name, so the
  // session hears when it retires) / one fewer.
  void AddHolder(Tensor& tensor, uint64_t session_id, bool by_name);
  void RemoveHolder(Tensor& tensor, uint64_t session_id);

  // Removes a tensor that has no binding, lease or pending hand-over (freeing its arena slot); returns
  // its buffer's memory when this was the buffer's last tensor and the buffer is not an
  // arena whose owner still lives, so the caller can free it off the RPC threads.
  std::unique_ptr<common::BackendBuffer> Remove(uint64_t tensor_id);
  // Removes a buffer no tensor points into (an arena whose owner closed); returns its memory.
  std::unique_ptr<common::BackendBuffer> RemoveBuffer(uint64_t buffer_id);

  // Bound names in order, [begin, end) under a prefix.
  const std::map<std::string, uint64_t>& names() const { return names_; }
  const absl::flat_hash_map<uint64_t, Tensor>& tensors() const { return tensors_; }
  size_t buffer_count() const { return buffers_.size(); }
  // The bound tensor with the lowest generation whose name lies under `prefix`, or null.
  Tensor* OldestUnder(const std::string& prefix);
  // How many tensors are bound directly under `prefix` (ending in '/').
  size_t CountUnder(const std::string& prefix) const;

  tensord::v1::TensorInfo Describe(const Tensor& tensor) const;

  // Running figures by namespace and by session; O(1) to read, whatever the tensor count.
  const UsageCounters& usage() const { return usage_; }
  // The same figures counted afresh from every tensor: what usage() must equal.
  UsageCounters RecountUsageForTest() const;

 private:
  // Adds (or, with `count` false, removes) `tensor` in `counters`, its holders included.
  static void Count(UsageCounters& counters, const Tensor& tensor, bool count);

  UsageCounters usage_;
  uint64_t last_tensor_id_ = 0;
  uint64_t last_buffer_id_ = 0;
  uint64_t last_generation_ = 0;
  absl::flat_hash_map<uint64_t, Tensor> tensors_;
  absl::flat_hash_map<uint64_t, Buffer> buffers_;
  std::map<std::string, uint64_t> names_;  // ordered for prefix scans
  // Each bound name under each of its folder prefixes ("a/" and "a/b/" for "a/b/c") as
  // (generation, tensor id), oldest first: a take finds the oldest under a prefix in
  // O(log n) however long the queue behind it is.
  absl::flat_hash_map<std::string, std::set<std::pair<uint64_t, uint64_t>>> queues_;
  void Enqueue(std::string_view name, uint64_t generation, uint64_t tensor_id);
  void Dequeue(std::string_view name, uint64_t generation, uint64_t tensor_id);
};

}  // namespace tensord::server
