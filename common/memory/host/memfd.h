// Host memory as sealed memfds: the mechanism behind the host backend and producer exports.
//
// A buffer is created with memfd_create(MFD_CLOEXEC|MFD_ALLOW_SEALING|MFD_NOEXEC_SEAL),
// retried without MFD_NOEXEC_SEAL on EINVAL (older kernels), sized with ftruncate, reserved
// with fallocate (so an over-committed node fails here with RESOURCE_EXHAUSTED instead of
// SIGBUS on first touch) and sealed F_SEAL_SHRINK|F_SEAL_GROW. F_SEAL_SEAL is not added:
// the producer still adds F_SEAL_FUTURE_WRITE after mapping it writable.
// Thread-safe free functions; errors name `what` and the syscall.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace tensord::common {

// Seals a published buffer must carry before any reader gets its fd.
inline constexpr int kRequiredReaderSeals = 0x0002 /*F_SEAL_SHRINK*/ | 0x0004 /*F_SEAL_GROW*/ |
                                            0x0010 /*F_SEAL_FUTURE_WRITE*/;

// A new sealed (SHRINK|GROW) memfd of `size` bytes (size 0 is refused: zero-byte tensors
// have no buffer). `debug_name` shows in /proc/<pid>/fd. RESOURCE_EXHAUSTED "reserve N MiB
// for <debug_name>: ..." when fallocate fails with ENOSPC/ENOMEM, or at once when `size`
// exceeds the node's RAM plus swap (fallocate on tmpfs would otherwise grind through
// reclaim and the OOM killer first). Callers still enforce quotas before calling this.
absl::StatusOr<UniqueFd> CreateSealedMemfd(const std::string& debug_name, uint64_t size);

// Adds F_SEAL_SHRINK|F_SEAL_GROW to an exported memfd (FAILED_PRECONDITION when it does
// not allow sealing or is already sealed against it) and returns its size (fstat).
absl::StatusOr<uint64_t> PrepareExportedMemfd(int fd, const std::string& what);

// Adds F_SEAL_FUTURE_WRITE (producer side, after mapping writable).
absl::Status SealFutureWrite(int fd, const std::string& what);

// F_GET_SEALS.
absl::StatusOr<int> GetSeals(int fd, const std::string& what);

// OK when `fd` is a memfd carrying kRequiredReaderSeals (F_SEAL_WRITE counts for
// F_SEAL_FUTURE_WRITE: it forbids even more); FAILED_PRECONDITION naming the missing seals
// otherwise, or "not a memfd".
absl::Status CheckReaderSeals(int fd, const std::string& what);

// fstat size.
absl::StatusOr<uint64_t> FdSize(int fd, const std::string& what);

// Whether the node backs memfds with transparent huge pages, as the operator set it in
// /sys/kernel/mm/transparent_hugepage/shmem_enabled: "always" and "within_size" do for the
// memfds the broker reserves with fallocate ("within_size": up to the memfd's size); "advise",
// "never" and "deny" do not (advise applies to pages faulted in through a mapping that asked,
// not to fallocate). Returns the selected word, or "unknown" when the file cannot be read.
std::string ShmemHugePages();

}  // namespace tensord::common
