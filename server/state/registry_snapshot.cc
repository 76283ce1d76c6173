#include "server/state/registry_snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tensord::server {
namespace {

constexpr char kMagic[8] = {'T', 'N', 'S', 'D', 'S', 'N', 'A', 'P'};
constexpr size_t kHeaderBytes = 32;
constexpr int kAllSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

uint64_t Fnv1a(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

template <typename T>
void Put(std::string& out, size_t at, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[at + i] = static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff);
}

template <typename T>
T Get(std::string_view in, size_t at) {
  uint64_t value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= uint64_t{static_cast<unsigned char>(in[at + i])} << (8 * i);
  return static_cast<T>(value);
}

absl::Status Invalid(const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat("registry snapshot: ", why));
}

}  // namespace

std::string StoredFdName(uint64_t buffer_id, size_t n) { return absl::StrCat("b", buffer_id, "-", n); }

absl::StatusOr<common::UniqueFd> WriteSnapshotMemfd(const tensord::v1::RegistrySnapshot& snapshot) {
  std::string payload;
  if (!snapshot.SerializeToString(&payload)) return absl::InternalError("registry snapshot: cannot serialize");
  if (payload.size() > kMaxSnapshotBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("registry snapshot: ", payload.size(), " bytes, more than ",
                                                     kMaxSnapshotBytes));
  }
  std::string file(kHeaderBytes, '\0');
  std::memcpy(file.data(), kMagic, sizeof(kMagic));
  Put<uint32_t>(file, 8, kSnapshotFormatVersion);
  Put<uint64_t>(file, 16, payload.size());
  Put<uint64_t>(file, 24, Fnv1a(payload));
  file += payload;
  common::UniqueFd fd(memfd_create("tensord-registry-snapshot", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return common::ErrnoToStatus("registry snapshot: memfd_create", errno);
  for (size_t written = 0; written < file.size();) {
    ssize_t n = write(fd.get(), file.data() + written, file.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return common::ErrnoToStatus("registry snapshot: write", errno);
    written += static_cast<size_t>(n);
  }
  if (fcntl(fd.get(), F_ADD_SEALS, kAllSeals) != 0) return common::ErrnoToStatus("registry snapshot: seal", errno);
  return fd;
}

absl::StatusOr<tensord::v1::RegistrySnapshot> ReadSnapshotMemfd(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return Invalid("not a memfd");
  if ((seals & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)) {
    return Invalid("the memfd is not sealed against writes and resizing");
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) return common::ErrnoToStatus("registry snapshot: fstat", errno);
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  if (size < kHeaderBytes) return Invalid(absl::StrCat(size, " bytes, shorter than its header"));
  if (size > kHeaderBytes + kMaxSnapshotBytes) return Invalid(absl::StrCat(size, " bytes, too large"));
  std::string file(size, '\0');
  for (size_t read_bytes = 0; read_bytes < size;) {
    ssize_t n = pread(fd, file.data() + read_bytes, size - read_bytes, static_cast<off_t>(read_bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return common::ErrnoToStatus("registry snapshot: read", errno);
    read_bytes += static_cast<size_t>(n);
  }
  if (std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0) return Invalid("wrong magic (not a registry snapshot)");
  const uint32_t version = Get<uint32_t>(file, 8);
  if (version != kSnapshotFormatVersion) {
    return Invalid(absl::StrCat("format version ", version, "; this tensord reads version ", kSnapshotFormatVersion));
  }
  const uint64_t payload_bytes = Get<uint64_t>(file, 16);
  if (payload_bytes != size - kHeaderBytes) {
    return Invalid(absl::StrCat("the header says ", payload_bytes, " payload bytes, the file holds ", size - kHeaderBytes));
  }
  const std::string_view payload = std::string_view(file).substr(kHeaderBytes);
  if (Fnv1a(payload) != Get<uint64_t>(file, 24)) return Invalid("bad checksum");
  tensord::v1::RegistrySnapshot snapshot;
  if (!snapshot.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return Invalid("the payload does not parse");
  }
  return snapshot;
}

}  // namespace tensord::server
