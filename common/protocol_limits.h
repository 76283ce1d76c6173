// The wire limits of the tensord protocol: bounds the broker enforces on what a client
// sends, and that the client keeps to (or splits its work by) so the broker never refuses
// it. The daemon and the client library both read them from here, so they cannot drift
// apart; proto/tensord/v1/*.proto states the same numbers for other clients. Changing one
// is a protocol change: a client built with a larger value than its broker's is refused.
//
// Limits that only one side keeps (queue depths, caches, per-uid quotas, API conveniences)
// stay with that side.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tensord::common {

// --- The fd channel (fd_channel.proto): one datagram per message ---

// Bytes of one message; the receiver's buffer, so anything longer arrives truncated.
inline constexpr size_t kMaxFdMessageBytes = 64 * 1024;
// Fds attached to one message: SCM_MAX_FD, the most one sendmsg() may carry.
inline constexpr size_t kMaxFdsPerMessage = 253;

// --- The Session stream (broker.proto) ---

// Requests in one SessionRequest.batch: bounds the work one message makes the broker queue.
inline constexpr int kMaxBatchRequests = 4096;
// Serialized bytes either side packs into one batch before it starts the next: far below
// the 4 MiB gRPC lets a client receive by default, so a batch never fails for its size.
inline constexpr size_t kMaxBatchBytes = size_t{1} << 20;
// A paged List answer (ListRequest.page_size set): at most this many entries and this many
// serialized bytes of them, whatever page_size asks (one entry even when it is larger).
inline constexpr size_t kMaxListPageEntries = 4096;
inline constexpr size_t kMaxListPageBytes = kMaxBatchBytes;
// An unpaged List answer (page_size 0, a client older than paging) in bytes: what gRPC lets a
// client receive by default (4 MiB), less room for the call's own framing. A listing larger
// than this is refused with RESOURCE_EXHAUSTED instead of failing in the client.
inline constexpr size_t kMaxUnpagedListBytes = (size_t{4} << 20) - 4096;
// Lease ids in one ReleaseRequest: all are released or none, under one broker lock hold.
inline constexpr size_t kMaxReleaseBatch = 65536;
// The deepest bounded work queue (QueueSlot.depth).
inline constexpr uint32_t kMaxQueueDepth = 65536;
// The longest wait (AcquireRequest / TakeRequest timeout_ms) or TTL (PublishRequest.ttl_ms)
// the broker keeps; longer ones are cut to it. A year is as good as forever, and the bound
// keeps now() plus the duration from overflowing.
inline constexpr uint64_t kMaxDurationMs = uint64_t{365} * 24 * 3600 * 1000;
// A hand-over's time to be redeemed (HandOverRequest.ttl_ms): 0 asks for the default; a
// longer one is refused (INVALID_ARGUMENT), since a pending hand-over holds its tensor.
inline constexpr uint64_t kDefaultHandOverTtlMs = 60 * 1000;
inline constexpr uint64_t kMaxHandOverTtlMs = 3600 * 1000;
// A hand-over token: 256 random bits as hex digits.
inline constexpr size_t kHandOverTokenBytes = 32;
// The most tokens one CancelHandOvers request may name.
inline constexpr size_t kMaxCancelHandOversBatch = 65536;

// --- What a tensor's record holds in the broker for its life ---

// A tensor name (names.h says what else a name must be) and each of its segments; a
// segment is one directory entry's worth, as in a file name.
inline constexpr size_t kMaxNameBytes = 512;
inline constexpr size_t kMaxSegmentBytes = 255;
// PublishRequest.ready_fence: an event handle of a stream-ordered backend (CUDA's is 88
// bytes, Level Zero's 32); the bound keeps the record small.
inline constexpr size_t kMaxReadyFenceBytes = 256;
// Tags (AllocateRequest / ExportRequest tags): entries, a key, a value, and keys plus
// values in all.
inline constexpr size_t kMaxTags = 64;
inline constexpr size_t kMaxTagKeyBytes = 256;
inline constexpr size_t kMaxTagValueBytes = 4096;
inline constexpr size_t kMaxTagBytes = 16384;

}  // namespace tensord::common
