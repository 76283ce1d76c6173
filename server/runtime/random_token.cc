#include "server/runtime/random_token.h"

#include <sys/random.h>

#include <cerrno>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status.h"

namespace tensord::server {

absl::StatusOr<std::string> NewRandomToken(size_t bytes, std::string_view what) {
  unsigned char buffer[64];
  TENSORD_CHECK(bytes <= sizeof(buffer));
  size_t filled = 0;
  while (filled < bytes) {
    ssize_t n = getrandom(buffer + filled, bytes - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return common::ErrnoToStatus(absl::StrCat("getrandom for ", common::AbslView(what)), errno);
    }
    filled += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(buffer), bytes));
}

}  // namespace tensord::server
