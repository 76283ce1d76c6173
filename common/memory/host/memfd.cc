#include "common/memory/host/memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"

// Older libc headers lack the newer flags; the numbers are the kernel's ABI.
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace tensord::common {
namespace {

static_assert(kRequiredReaderSeals == (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE));

// memfd_create refuses names longer than this (MFD_NAME_MAX_LEN).
constexpr size_t kMaxMemfdName = 249;

std::string SealNames(int seals) {
  std::vector<std::string> names;
  if (seals & F_SEAL_SEAL) names.push_back("F_SEAL_SEAL");
  if (seals & F_SEAL_SHRINK) names.push_back("F_SEAL_SHRINK");
  if (seals & F_SEAL_GROW) names.push_back("F_SEAL_GROW");
  if (seals & F_SEAL_WRITE) names.push_back("F_SEAL_WRITE");
  if (seals & F_SEAL_FUTURE_WRITE) names.push_back("F_SEAL_FUTURE_WRITE");
  return names.empty() ? "none" : absl::StrJoin(names, "|");
}

// "4096 MiB" for sizes of a MiB or more (rounded up), bytes below.
std::string HumanSize(uint64_t size) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  if (size < kMiB) return absl::StrCat(size, " bytes");
  return absl::StrCat((size + kMiB - 1) / kMiB, " MiB");
}

absl::StatusOr<UniqueFd> MemfdCreate(const std::string& debug_name) {
  std::string name = debug_name.substr(0, kMaxMemfdName);
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
  // Kernels before 6.3 do not know MFD_NOEXEC_SEAL.
  if (fd < 0 && errno == EINVAL) fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoToStatus(absl::StrCat("memfd_create for ", debug_name), errno);
  return UniqueFd(fd);
}

// Backs every page now, so that an over-committed node fails here and not with SIGBUS
// on first touch.
absl::Status Reserve(int fd, uint64_t size, const std::string& debug_name) {
  // fallocate on an unlimited tmpfs does not fail fast: it allocates page after page until
  // reclaim and the OOM killer give up. A size beyond all of the node's memory is refused
  // before any of that starts.
  struct sysinfo info {};
  if (::sysinfo(&info) == 0) {
    uint64_t total = 0;
    bool total_overflows = __builtin_mul_overflow(
        static_cast<uint64_t>(info.totalram) + info.totalswap, info.mem_unit, &total);
    if (!total_overflows && size > total) {
      return absl::ResourceExhaustedError(
          absl::StrCat("reserve ", HumanSize(size), " for ", debug_name, ": the node has only ",
                       HumanSize(total), " of memory and swap"));
    }
  }
  int rc;
  do {
    rc = ::fallocate(fd, 0, 0, static_cast<off_t>(size));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return absl::OkStatus();
  int err = errno;
  std::string what = absl::StrCat("reserve ", HumanSize(size), " for ", debug_name);
  if (err == EOPNOTSUPP) {
    // Only filesystems without fallocate get here (memfds have it): the memory is then
    // committed lazily, as plain mmap would be.
    spdlog::debug("{}: fallocate not supported; memory will be committed on first touch", what);
    return absl::OkStatus();
  }
  if (err == ENOSPC || err == ENOMEM) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": the node cannot back it (", std::strerror(err), ")"));
  }
  return ErrnoToStatus(what, err);
}

absl::Status AddSeals(int fd, int seals, const std::string& what) {
  if (::fcntl(fd, F_ADD_SEALS, seals) == 0) return absl::OkStatus();
  int err = errno;
  std::string action = absl::StrCat("add ", SealNames(seals), " to ", what);
  if (err == EPERM) {
    return absl::FailedPreconditionError(absl::StrCat(
        action, ": sealing is not allowed (created without MFD_ALLOW_SEALING, or F_SEAL_SEAL)"));
  }
  if (err == EINVAL) {
    return absl::FailedPreconditionError(absl::StrCat(
        action, ": not a sealable memfd, or the kernel lacks this seal (F_SEAL_FUTURE_WRITE "
                "needs Linux 5.1)"));
  }
  if (err == EBUSY) {
    return absl::FailedPreconditionError(
        absl::StrCat(action, ": a writable shared mapping of it exists"));
  }
  return ErrnoToStatus(action, err);
}

}  // namespace

absl::StatusOr<UniqueFd> CreateSealedMemfd(const std::string& debug_name, uint64_t size) {
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memfd for ", debug_name, ": size 0 refused (zero-byte tensors have no buffer)"));
  }
  if (size > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memfd for ", debug_name, ": ", size, " bytes is too large"));
  }
  TENSORD_ASSIGN_OR_RETURN(UniqueFd fd, MemfdCreate(debug_name));
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return ErrnoToStatus(absl::StrCat("ftruncate ", debug_name, " to ", size, " bytes"), errno);
  }
  TENSORD_RETURN_IF_ERROR(Reserve(fd.get(), size, debug_name));
  TENSORD_RETURN_IF_ERROR(AddSeals(fd.get(), F_SEAL_SHRINK | F_SEAL_GROW, debug_name));
  return fd;
}

absl::StatusOr<uint64_t> PrepareExportedMemfd(int fd, const std::string& what) {
  TENSORD_ASSIGN_OR_RETURN(int seals, GetSeals(fd, what));
  constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;
  if ((seals & kSizeSeals) != kSizeSeals) {
    if (seals & F_SEAL_SEAL) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": carries F_SEAL_SEAL without F_SEAL_SHRINK|F_SEAL_GROW (has ",
                       SealNames(seals), "), so its size cannot be pinned"));
    }
    TENSORD_RETURN_IF_ERROR(AddSeals(fd, kSizeSeals, what));
  }
  return FdSize(fd, what);
}

absl::Status SealFutureWrite(int fd, const std::string& what) {
  return AddSeals(fd, F_SEAL_FUTURE_WRITE, what);
}

absl::StatusOr<int> GetSeals(int fd, const std::string& what) {
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals >= 0) return seals;
  if (errno == EINVAL) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": not a memfd (F_GET_SEALS: ", std::strerror(errno), ")"));
  }
  return ErrnoToStatus(absl::StrCat("F_GET_SEALS on ", what), errno);
}

absl::Status CheckReaderSeals(int fd, const std::string& what) {
  TENSORD_ASSIGN_OR_RETURN(int seals, GetSeals(fd, what));
  // F_SEAL_WRITE forbids every write, so it stands in for F_SEAL_FUTURE_WRITE.
  int effective = (seals & F_SEAL_WRITE) ? (seals | F_SEAL_FUTURE_WRITE) : seals;
  int missing = kRequiredReaderSeals & ~effective;
  if (missing == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": missing seals ", SealNames(missing), " (has ", SealNames(seals),
      "); the producer must seal the buffer before it is published"));
}

std::string ShmemHugePages() {
  char text[256] = {};
  const int fd = ::open("/sys/kernel/mm/transparent_hugepage/shmem_enabled", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "unknown";
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  // "always within_size advise [never] deny force": the selected word is bracketed.
  const std::string_view all(text, n > 0 ? static_cast<size_t>(n) : 0);
  const size_t open = all.find('[');
  const size_t close = all.find(']', open);
  if (open == std::string_view::npos || close == std::string_view::npos) return "unknown";
  return std::string(all.substr(open + 1, close - open - 1));
}

absl::StatusOr<uint64_t> FdSize(int fd, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(absl::StrCat("fstat ", what), errno);
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace tensord::common
