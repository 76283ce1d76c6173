#include "common/memory/host/host_importer.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "common/memory/host/memfd.h"
#include "common/memory/host/pagemap_scan.h"
#include "common/status.h"

namespace tensord::common {
namespace {

constexpr int kSealShrink = 0x0002;  // F_SEAL_SHRINK
constexpr int kMadvPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14), the kernel's ABI

// This process's /proc/self/pagemap, opened once per process: a forked child must not read
// its parent's, so the fd is kept with the pid that opened it. -1: not readable here.
int PagemapFd() {
  // (pid << 32) | (fd + 1); 0: not opened yet.
  static std::atomic<uint64_t> cached{0};
  const uint64_t pid = static_cast<uint32_t>(::getpid());
  uint64_t seen = cached.load(std::memory_order_acquire);
  for (;;) {
    if (seen != 0 && (seen >> 32) == pid) return static_cast<int>(seen & 0xffffffffu) - 1;
    const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    const uint64_t mine = (pid << 32) | static_cast<uint32_t>(fd + 1);
    if (cached.compare_exchange_strong(seen, mine, std::memory_order_acq_rel)) {
      // A parent's fd, inherited by this child: nobody here uses it (its pid differs).
      const int inherited = static_cast<int>(seen & 0xffffffffu) - 1;
      if (seen != 0 && inherited >= 0) ::close(inherited);
      return fd;
    }
    if (fd >= 0) ::close(fd);  // another thread installed one first; `seen` holds it now
  }
}

// HasPrivateCopies through PAGEMAP_SCAN; nullopt where the kernel has no such ioctl.
std::optional<bool> ScanForPrivateCopies(int fd, const uint8_t* begin, const uint8_t* end) {
  static std::atomic<bool> unsupported{false};
  if (unsupported.load(std::memory_order_relaxed)) return std::nullopt;
  pagemap::PageRegion found{};
  pagemap::ScanArg arg =
      pagemap::PrivateCopyScan(reinterpret_cast<uintptr_t>(begin), reinterpret_cast<uintptr_t>(end), &found);
  // About half the cost of reading every entry of a 64 MiB range.
  const int regions = ::ioctl(fd, pagemap::kScan, &arg);
  if (regions >= 0) return regions > 0;
  if (errno == ENOTTY || errno == EINVAL) unsupported.store(true, std::memory_order_relaxed);
  return std::nullopt;
}

// Whether a page of [begin, end) (page-aligned) holds a private copy of this process's:
// written since it was mapped (present and anonymous) or such a page swapped out. Pages
// only read map the buffer's own pages and need no discard. nullopt: cannot tell.
std::optional<bool> HasPrivateCopies(const uint8_t* begin, const uint8_t* end, uint64_t page) {
  const int fd = PagemapFd();
  if (fd < 0) return std::nullopt;
  if (std::optional<bool> scanned = ScanForPrivateCopies(fd, begin, end)) return scanned;
  constexpr uint64_t kPresent = uint64_t{1} << 63;
  constexpr uint64_t kSwapped = uint64_t{1} << 62;
  constexpr uint64_t kFileOrShared = uint64_t{1} << 61;
  uint64_t entries[512];  // 4 KiB of pagemap per read: a 64 MiB buffer takes 32 reads
  uint64_t first = reinterpret_cast<uintptr_t>(begin) / page;
  const uint64_t last = reinterpret_cast<uintptr_t>(end) / page;
  while (first < last) {
    const uint64_t n = std::min<uint64_t>(last - first, std::size(entries));
    const ssize_t want = static_cast<ssize_t>(n * sizeof(uint64_t));
    const off_t at = static_cast<off_t>(first * sizeof(uint64_t));
    if (::pread(fd, entries, static_cast<size_t>(want), at) != want) return std::nullopt;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t e = entries[i];
      if ((e & kSwapped) != 0 || ((e & kPresent) != 0 && (e & kFileOrShared) == 0)) return true;
    }
    first += n;
  }
  return false;
}

}  // namespace

absl::Status HostRegion::DiscardPrivatePages(uint64_t offset, uint64_t length) const {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (mode() != MapMode::kPrivate || length == 0 || offset % page != 0 ||
      offset >= size()) {
    return absl::OkStatus();
  }
  const uint64_t end = std::min(size(), (offset + length + page - 1) / page * page);
  // Most readers never write: then there is nothing to discard, and skipping the madvise
  // spares a TLB shootdown of every CPU this process runs on and a page fault per page the
  // next time the slot is read.
  if (HasPrivateCopies(data() + offset, data() + end, page) == std::optional<bool>(false)) {
    return absl::OkStatus();
  }
  if (::madvise(data() + offset, end - offset, MADV_DONTNEED) != 0) {
    return ErrnoToStatus("discard private pages of a mapping", errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ImportedRegion>> HostImporter::Import(const FetchedBuffer& buffer, MapMode mode,
                                                                     const std::string& what) {
  if (!buffer.handle.data.empty() || buffer.handle.fds.size() != 1) {
    return absl::DataLossError(what + ": a host buffer comes as one memfd and no handle bytes, not " +
                               std::to_string(buffer.handle.fds.size()) + " fds and " +
                               std::to_string(buffer.handle.data.size()) + " bytes");
  }
  const int fd = buffer.handle.fds[0].get();
  if (buffer.size == 0) return absl::DataLossError(what + ": the broker sent a zero-size buffer");
  // Touching a mapping beyond the end of the file raises SIGBUS, and so would a buffer that
  // could shrink under us: check both before mapping.
  TENSORD_ASSIGN_OR_RETURN(uint64_t actual, FdSize(fd, what));
  if (actual < buffer.size) {
    return absl::DataLossError(what + ": the fd holds " + std::to_string(actual) + " bytes, the broker says " +
                               std::to_string(buffer.size));
  }
  TENSORD_ASSIGN_OR_RETURN(int seals, GetSeals(fd, what));
  if ((seals & kSealShrink) == 0) {
    return absl::FailedPreconditionError(what + ": the buffer is not sealed against shrinking");
  }
  TENSORD_ASSIGN_OR_RETURN(MappedRegion region, MappedRegion::Map(fd, buffer.size, mode, what));
  // Best effort: one call maps every page the producer is about to write. Only for its own
  // shared mapping: on a copy-on-write one it would copy every page. Kernels before 5.14
  // answer EINVAL, and the pages then fault in one by one as before.
  if (buffer.populate && mode == MapMode::kSharedWritable) {
    (void)::madvise(region.data(), buffer.size, kMadvPopulateWrite);
  }
  // Readers are protected by this seal; the producer's mapping made just before stays writable.
  if (mode == MapMode::kSharedWritable) TENSORD_RETURN_IF_ERROR(SealFutureWrite(fd, what));
  return std::make_unique<HostRegion>(std::move(region));
}

absl::StatusOr<MemoryHandle> HostImporter::ExportExisting(const void* ptr, uint64_t bytes,
                                                          const tensord::v1::Device& device,
                                                          const std::string& what) const {
  (void)ptr;
  (void)bytes;
  (void)device;
  return absl::UnimplementedError(what + ": host memory is not exported by pointer; export a memfd "
                                  "(Client::Export), whose seals keep readers safe");
}

}  // namespace tensord::common
