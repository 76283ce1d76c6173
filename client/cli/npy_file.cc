#include "client/cli/npy_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/tensor_desc.h"

namespace tensord::cli {
namespace {

// The header and its dictionary fit here (ParseNpyHeader needs no more).
constexpr uint64_t kHeaderPrefixBytes = 1 << 20;
// One read or write moves at most this much, and WriteCOrder gathers this much at a time.
constexpr uint64_t kIoChunkBytes = 1 << 30;
constexpr size_t kGatherBytes = 1 << 20;

Status ErrnoStatus(const std::string& what, int err) {
  StatusCode code = (err == ENOENT) ? StatusCode::kNotFound
                    : (err == EACCES || err == EPERM) ? StatusCode::kPermissionDenied
                    : (err == ENOSPC || err == ENOMEM) ? StatusCode::kResourceExhausted
                    : StatusCode::kUnknown;
  return Status(code, what + ": " + std::strerror(err));
}

Status PreadAll(int fd, uint8_t* dst, uint64_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t got = ::pread(fd, dst, std::min(n, kIoChunkBytes), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoStatus("read " + path, errno);
    if (got == 0) return Status(StatusCode::kDataLoss, path + " is shorter than its header says");
    dst += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return Status();
}

Status WriteAll(int fd, const uint8_t* src, uint64_t n, const std::string& path) {
  while (n > 0) {
    ssize_t put = ::write(fd, src, std::min(n, kIoChunkBytes));
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return ErrnoStatus("write " + path, errno);
    src += put;
    n -= static_cast<uint64_t>(put);
  }
  return Status();
}

std::vector<int64_t> FortranStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

// Equal strides, ignoring dims of size <= 1 (their stride never matters).
bool SameLayout(const std::vector<int64_t>& shape, const std::vector<int64_t>& a,
                const std::vector<int64_t>& b) {
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] > 1 && a[i] != b[i]) return false;
  }
  return true;
}

// Writes the elements of a strided tensor in C order, a chunk at a time.
Status WriteCOrder(int fd, const TensorInfo& t, const uint8_t* base, uint64_t item,
                   const std::string& path) {
  const size_t nd = t.shape.size();
  std::vector<int64_t> index(nd, 0);
  std::vector<uint8_t> chunk;
  chunk.reserve(kGatherBytes);
  const uint64_t count = t.nbytes / item;
  for (uint64_t e = 0; e < count; ++e) {
    int64_t off = 0;
    for (size_t d = 0; d < nd; ++d) off += index[d] * t.strides[d];
    const uint8_t* src = base + static_cast<uint64_t>(off) * item;
    chunk.insert(chunk.end(), src, src + item);
    if (chunk.size() >= kGatherBytes) {
      Status s = WriteAll(fd, chunk.data(), chunk.size(), path);
      if (!s.ok()) return s;
      chunk.clear();
    }
    for (size_t d = nd; d-- > 0;) {
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
  return WriteAll(fd, chunk.data(), chunk.size(), path);
}

}  // namespace

Result<NpyFile> NpyFile::Open(const std::string& path) {
  common::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("open " + path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  if (!S_ISREG(st.st_mode)) return Status(StatusCode::kInvalidArgument, path + " is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::string prefix(std::min(size, kHeaderPrefixBytes), '\0');
  Status read = PreadAll(fd.get(), reinterpret_cast<uint8_t*>(prefix.data()), prefix.size(), 0, path);
  if (!read.ok()) return read;
  absl::StatusOr<common::NpyHeader> header = common::ParseNpyHeader(prefix, size);
  if (!header.ok()) {
    return Status(StatusCode::kInvalidArgument, path + ": " + std::string(header.status().message()));
  }
  // The header names only dtypes tensord has, by the names the public API reads.
  Result<DLDataType> dtype = ParseDTypeName(common::DTypeName(header->dtype));
  if (!dtype.ok()) return Status(StatusCode::kInvalidArgument, path + ": " + dtype.status().message());
  TensorSpec spec;
  spec.dtype = *dtype;
  spec.shape = header->shape;
  if (header->fortran_order) spec.strides = FortranStrides(header->shape);
  return NpyFile(path, std::move(fd), *std::move(header), std::move(spec));
}

Status NpyFile::ReadDataInto(void* dst) const {
  return PreadAll(fd_.get(), static_cast<uint8_t*>(dst), header_.data_bytes, header_.data_offset, path_);
}

Status WriteNpyFile(const TensorRef& tensor, const std::string& path) {
  const TensorInfo& t = tensor.info();
  Result<std::string> dtype_name = DTypeName(t.dtype);
  if (!dtype_name.ok()) return dtype_name.status();
  absl::StatusOr<tensord::v1::DataType> dtype = common::ParseDTypeName(*dtype_name);
  if (!dtype.ok()) return Status(StatusCode::kInvalidArgument, std::string(dtype.status().message()));
  const uint64_t item = common::ItemBytes(*dtype);
  const bool c_order = SameLayout(t.shape, t.strides, common::CompactStrides(t.shape));
  const bool f_order = !c_order && SameLayout(t.shape, t.strides, FortranStrides(t.shape));
  absl::StatusOr<std::string> header = common::FormatNpyHeader(*dtype, t.shape, f_order);
  if (!header.ok()) return Status(StatusCode::kInvalidArgument, std::string(header.status().message()));
  common::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus("open " + path, errno);
  Status s = WriteAll(fd.get(), reinterpret_cast<const uint8_t*>(header->data()), header->size(), path);
  if (!s.ok()) return s;
  if (t.nbytes == 0) return Status();
  const auto* data = static_cast<const uint8_t*>(tensor.data());
  if (c_order || f_order) return WriteAll(fd.get(), data, t.nbytes, path);
  return WriteCOrder(fd.get(), t, data, item, path);
}

}  // namespace tensord::cli
