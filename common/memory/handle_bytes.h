// Little-endian fields of the fixed-layout handle and fence bytes GPU backends write
// (cuda_handle.h, ze_handle.h): one spelling of the byte order for all of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tensord::common::handle_bytes {

// Appends the low `bytes` bytes of `value`, least significant first.
inline void PutLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// The `bytes`-byte little-endian value at `at`; the caller has checked the length.
inline uint64_t GetLe(std::string_view in, size_t at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + static_cast<size_t>(i)])) << (8 * i);
  }
  return value;
}

}  // namespace tensord::common::handle_bytes
