// PAGEMAP_SCAN (Linux 6.7): an ioctl on /proc/<pid>/pagemap that walks a range's page table
// in the kernel and reports only the pages whose categories match, instead of one entry per
// page. The structures and numbers are the kernel's ABI (linux/fs.h), declared here because
// Debian 12's headers predate them. Older kernels answer ENOTTY or EINVAL.
#pragma once

#include <sys/ioctl.h>

#include <cstdint>

namespace tensord::common::pagemap {

struct PageRegion {
  uint64_t start, end, categories;
};

struct ScanArg {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask,
      category_anyof_mask, return_mask;
};

inline constexpr unsigned long kScan = _IOWR('f', 16, ScanArg);
inline constexpr uint64_t kIsFile = 1 << 2;
inline constexpr uint64_t kIsPresent = 1 << 3;
inline constexpr uint64_t kIsSwapped = 1 << 4;

// A scan of [start, end) for the first page that is not the file's own (so a private copy)
// and is present or swapped out: one region at most in `found`.
inline ScanArg PrivateCopyScan(uint64_t start, uint64_t end, PageRegion* found) {
  return ScanArg{sizeof(ScanArg), 0, start, end, 0, reinterpret_cast<uintptr_t>(found), 1, 1,
                 kIsFile, kIsFile, kIsPresent | kIsSwapped, kIsFile | kIsPresent | kIsSwapped};
}

}  // namespace tensord::common::pagemap
