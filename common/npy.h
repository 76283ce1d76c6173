// The .npy format (versions 1.0, 2.0, 3.0): header parsing and writing, for tensorctl.
// The parser treats the file as hostile: it checks the magic, the header length, the
// dictionary syntax, the dtype, that shape's byte size does not overflow, and that the
// file holds exactly the data the header promises.
//
// dtypes: '|b1' bool, i1/i2/i4/i8, u1/u2/u4/u8, f2/f4/f8, c8/c16 (either byte order in the
// file; big-endian data is refused with INVALID_ARGUMENT since tensord shares native-order
// memory), and bfloat16 where the descr names it ('bfloat16' or '<bfloat16').
// fortran_order: True is described with Fortran strides, not copied.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tensord/v1/tensor.pb.h"

namespace tensord::common {

struct NpyHeader {
  tensord::v1::DataType dtype;
  std::vector<int64_t> shape;
  bool fortran_order = false;
  uint64_t data_offset = 0;  // where the element data starts in the file
  uint64_t data_bytes = 0;   // product(shape) * item size
};

// Parses the header at the start of `prefix` (the first bytes of the file; at most the
// first 1 MiB is needed) of a file `file_size` bytes long. INVALID_ARGUMENT naming what is
// wrong, e.g. "npy: header says 4000 data bytes but the file has 12".
absl::StatusOr<NpyHeader> ParseNpyHeader(std::string_view prefix, uint64_t file_size);

// A complete header (magic .. newline, padded to 64 bytes) for an array of `dtype` and
// `shape`. fortran_order writes 'fortran_order': True. INVALID_ARGUMENT for a dtype .npy
// cannot express.
absl::StatusOr<std::string> FormatNpyHeader(const tensord::v1::DataType& dtype,
                                            const std::vector<int64_t>& shape,
                                            bool fortran_order);

}  // namespace tensord::common
