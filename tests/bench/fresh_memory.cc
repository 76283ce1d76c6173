// tensord_fresh_memory: what a large tensor's memory costs when it is fresh and when it is
// already mapped, step by step, in one process with plain syscalls (no daemon): the profile
// behind recycled buffers (docs/performance.md, "Big tensors").
//
// For a memfd of --mib MiB (default 64), median of --reps runs (default 5), in milliseconds:
//   create+fallocate     memfd_create, ftruncate, fallocate: what the daemon's Allocate does
//   producer fill, faults  a fresh MAP_SHARED mapping written once (a fault per page)
//   producer populate    MADV_POPULATE_WRITE of a fresh mapping, then the fill
//   producer fill, mapped  the same memory written again (what a recycled buffer costs)
//   reader touch, faults a fresh MAP_PRIVATE mapping, one byte read per page
//   reader populate+touch  MADV_POPULATE_READ of a fresh MAP_PRIVATE mapping, then the touch
//   reader touch, mapped the touch again (a reader's lingering mapping of a recycled buffer)
//   private-page check   pread of every pagemap entry / PAGEMAP_SCAN (Linux 6.7) of the
//                        reader's mapping: what a reader checks before each release
//   reader munmap        the reader's munmap of a faulted-in mapping
//   last munmap+close    the producer's munmap and the last close: the pages go back
// It prints the node's shmem_enabled (transparent huge pages for memfds) first.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/memory/host/memfd.h"
#include "common/memory/host/pagemap_scan.h"

namespace {

constexpr int kPopulateRead = 22;   // MADV_POPULATE_READ (Linux 5.14)
constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

uint8_t* Map(int fd, size_t bytes, int flags) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) Die("mmap");
  return static_cast<uint8_t*>(p);
}

long Touch(const uint8_t* p, size_t bytes, size_t page) {
  long sum = 0;
  for (size_t off = 0; off < bytes; off += page) sum += p[off];
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 64;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mib") == 0) mib = std::strtoul(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  const size_t bytes = mib << 20;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const int pagemap = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  std::map<std::string, std::vector<double>> ms;
  const std::vector<std::string> order = {
      "create+fallocate",     "producer fill, faults", "producer populate+fill", "producer fill, mapped",
      "reader touch, faults", "reader populate+touch", "reader touch, mapped",  "check, pagemap pread",
      "check, PAGEMAP_SCAN",  "reader munmap",         "last munmap+close"};
  long sink = 0;
  for (int rep = 0; rep < reps; ++rep) {
    for (bool populate : {false, true}) {
      auto start = Clock::now();
      int fd = ::memfd_create("fresh", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0 || ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
        Die("memfd");
      }
      ms["create+fallocate"].push_back(Ms(start));
      uint8_t* w = Map(fd, bytes, MAP_SHARED);
      start = Clock::now();
      if (populate) (void)::madvise(w, bytes, kPopulateWrite);
      std::memset(w, rep + 1, bytes);
      ms[populate ? "producer populate+fill" : "producer fill, faults"].push_back(Ms(start));
      start = Clock::now();
      std::memset(w, rep + 2, bytes);
      ms["producer fill, mapped"].push_back(Ms(start));

      uint8_t* r = Map(fd, bytes, MAP_PRIVATE);
      start = Clock::now();
      if (populate) (void)::madvise(r, bytes, kPopulateRead);
      sink += Touch(r, bytes, page);
      ms[populate ? "reader populate+touch" : "reader touch, faults"].push_back(Ms(start));
      start = Clock::now();
      sink += Touch(r, bytes, page);
      ms["reader touch, mapped"].push_back(Ms(start));
      if (pagemap >= 0 && !populate) {
        std::vector<uint64_t> entries(512);
        start = Clock::now();
        for (size_t off = 0; off < bytes; off += entries.size() * page) {
          const off_t at = static_cast<off_t>((reinterpret_cast<uintptr_t>(r) + off) / page * sizeof(uint64_t));
          if (::pread(pagemap, entries.data(), entries.size() * sizeof(uint64_t), at) < 0) Die("pread pagemap");
          for (uint64_t e : entries) sink += static_cast<long>(e >> 61 & 1);
        }
        ms["check, pagemap pread"].push_back(Ms(start));
        namespace pm = tensord::common::pagemap;
        pm::PageRegion found{};
        pm::ScanArg arg =
            pm::PrivateCopyScan(reinterpret_cast<uintptr_t>(r), reinterpret_cast<uintptr_t>(r) + bytes, &found);
        start = Clock::now();
        if (::ioctl(pagemap, pm::kScan, &arg) >= 0) ms["check, PAGEMAP_SCAN"].push_back(Ms(start));
      }
      start = Clock::now();
      ::munmap(r, bytes);
      ms["reader munmap"].push_back(Ms(start));
      start = Clock::now();
      ::munmap(w, bytes);
      ::close(fd);
      ms["last munmap+close"].push_back(Ms(start));
    }
  }
  std::printf("fresh memory, %zu MiB, median of %d runs (ms); shmem_enabled: %s\n", mib, reps,
              tensord::common::ShmemHugePages().c_str());
  for (const std::string& step : order) {
    std::vector<double>& v = ms[step];
    if (v.empty()) {
      std::printf("  %-24s %10s\n", step.c_str(), "n/a");
      continue;
    }
    std::sort(v.begin(), v.end());
    std::printf("  %-24s %10.2f\n", step.c_str(), v[v.size() / 2]);
  }
  return sink == 42 ? 1 : 0;  // keeps the reads
}
