// .npy files for `tensorctl put` and `get -o`.
//
// NpyFile reads one, treating it as hostile: Open checks the whole header against the file
// (common::ParseNpyHeader) before the caller allocates anything, so a bad file registers
// nothing, and ReadDataInto reads the elements with pread straight into the tensor's memory.
// A Fortran-ordered array keeps its layout: spec() describes it with Fortran strides.
// WriteNpyFile writes a tensor in C order, or in Fortran order when it is laid out so; any
// other strides are written element by element in C order.
//
// Errors name the file and the cause: the system call's ("open /tmp/a.npy: No such file or
// directory": NOT_FOUND, PERMISSION_DENIED, RESOURCE_EXHAUSTED for ENOSPC/ENOMEM, UNKNOWN for
// the rest), INVALID_ARGUMENT for a file that is not a .npy tensord can hold or a tensor .npy
// cannot express, DATA_LOSS for a file shorter than its header says. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "common/npy.h"
#include "common/unique_fd.h"
#include "tensord/client.h"

namespace tensord::cli {

class NpyFile {
 public:
  // Opens `path` and checks it: a regular file whose header and length agree.
  static Result<NpyFile> Open(const std::string& path);

  // The dtype, shape and (for Fortran order) strides of the array in the file.
  const TensorSpec& spec() const { return spec_; }
  // Bytes of element data; what ReadDataInto writes.
  uint64_t data_bytes() const { return header_.data_bytes; }
  // Reads the element data into `dst`, data_bytes() of them.
  Status ReadDataInto(void* dst) const;

 private:
  NpyFile(std::string path, common::UniqueFd fd, common::NpyHeader header, TensorSpec spec)
      : path_(std::move(path)), fd_(std::move(fd)), header_(std::move(header)), spec_(std::move(spec)) {}

  std::string path_;
  common::UniqueFd fd_;
  common::NpyHeader header_;
  TensorSpec spec_;
};

// Writes `tensor` (host memory, readable through data()) to `path` as .npy, replacing the
// file if there is one.
Status WriteNpyFile(const TensorRef& tensor, const std::string& path);

}  // namespace tensord::cli
