// FUZZ_CHECK(cond) << "detail": the fuzzers' invariant check. A broken invariant prints
// what was expected and aborts, which libFuzzer records as a crash with its input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tensord::fuzz {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": invariant broken: " << condition << ": ";
  }
  ~CheckFailure() {
    std::fprintf(stderr, "%s\n", stream_.str().c_str());
    std::abort();
  }
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// A status code gRPC knows (0..16) that is not UNKNOWN: every error names its cause.
inline bool IsCanonical(const absl::Status& status) {
  int code = static_cast<int>(status.code());
  return code >= 0 && code <= 16 && status.code() != absl::StatusCode::kUnknown;
}

// Error messages are one readable line: printable ASCII, bounded however long the input.
inline bool IsReadableMessage(absl::string_view message, size_t max_bytes) {
  if (message.size() > max_bytes) return false;
  for (char c : message) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace tensord::fuzz

#define FUZZ_CHECK(condition) \
  if (condition) {            \
  } else                      \
    ::tensord::fuzz::CheckFailure(__FILE__, __LINE__, #condition)
