// The .npy header reader (common/npy.h), which tensorctl runs on files it is handed: the
// input is a whole file, read either whole or through a shorter prefix.
//
// Invariants: an accepted header describes exactly the bytes after it (data_offset +
// data_bytes == file size, data_bytes == product(shape) * item size) with at most kMaxNdim
// dimensions and a known dtype, and what FormatNpyHeader writes for it reads back the same,
// 64-byte aligned; a refused file gets INVALID_ARGUMENT "npy: ..." in one readable line.
#include <cstdint>
#include <string_view>

#include "common/npy.h"
#include "common/tensor_desc.h"
#include "tests/fuzz/fuzz_check.h"

namespace tensord::common {
namespace {

using u128 = unsigned __int128;

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument) << status;
  FUZZ_CHECK(status.message().substr(0, 5) == "npy: ") << status;
  FUZZ_CHECK(fuzz::IsReadableMessage(status.message(), 1024)) << status;
}

void CheckHeader(const NpyHeader& header, uint64_t file_size) {
  uint64_t item = ItemBytes(header.dtype);
  FUZZ_CHECK(item > 0);
  FUZZ_CHECK(header.shape.size() <= static_cast<size_t>(kMaxNdim));
  u128 bytes = item;
  for (int64_t dim : header.shape) {
    FUZZ_CHECK(dim >= 0) << dim;
    bytes *= static_cast<u128>(dim);
    if (bytes > file_size) bytes = static_cast<u128>(file_size) + 1;  // stays small; fails below
  }
  FUZZ_CHECK(bytes == header.data_bytes) << "data_bytes " << header.data_bytes;
  FUZZ_CHECK(header.data_offset <= file_size);
  FUZZ_CHECK(header.data_offset + header.data_bytes == file_size);

  // What the writer makes of this header, the reader reads back unchanged.
  absl::StatusOr<std::string> written =
      FormatNpyHeader(header.dtype, header.shape, header.fortran_order);
  FUZZ_CHECK(written.ok()) << written.status();
  FUZZ_CHECK(written->size() % 64 == 0) << written->size();
  absl::StatusOr<NpyHeader> reread = ParseNpyHeader(*written, written->size() + header.data_bytes);
  FUZZ_CHECK(reread.ok()) << reread.status();
  FUZZ_CHECK(reread->dtype.code() == header.dtype.code() &&
             reread->dtype.bits() == header.dtype.bits());
  FUZZ_CHECK(reread->shape == header.shape);
  FUZZ_CHECK(reread->fortran_order == header.fortran_order);
  FUZZ_CHECK(reread->data_offset == written->size());
  FUZZ_CHECK(reread->data_bytes == header.data_bytes);
}

void Check(std::string_view file) {
  absl::StatusOr<NpyHeader> whole = ParseNpyHeader(file, file.size());
  if (whole.ok()) {
    CheckHeader(*whole, file.size());
  } else {
    CheckRefusal(whole.status());
  }
  // tensorctl reads a prefix of a large file: the answer depends only on the header, so a
  // prefix that holds the header gives the same one, and a shorter one is refused.
  for (size_t cut : {size_t{10}, size_t{64}, file.size() / 2}) {
    if (cut >= file.size()) continue;
    absl::StatusOr<NpyHeader> partial = ParseNpyHeader(file.substr(0, cut), file.size());
    if (partial.ok()) {
      FUZZ_CHECK(whole.ok()) << "a prefix of " << cut << " bytes passed, the file did not: "
                             << whole.status();
      FUZZ_CHECK(partial->data_offset == whole->data_offset &&
                 partial->data_bytes == whole->data_bytes && partial->shape == whole->shape);
    } else {
      CheckRefusal(partial.status());
      if (whole.ok()) {
        FUZZ_CHECK(cut < whole->data_offset) << partial.status();
      }
    }
  }
  // A prefix longer than the file says it is.
  if (!file.empty()) {
    absl::StatusOr<NpyHeader> liar = ParseNpyHeader(file, file.size() - 1);
    FUZZ_CHECK(!liar.ok());
    CheckRefusal(liar.status());
  }
}

}  // namespace
}  // namespace tensord::common

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tensord::common::Check(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
