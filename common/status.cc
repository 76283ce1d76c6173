#include "common/status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tensord::common {

absl::Status ErrnoToStatus(std::string_view what, int err) {
  std::string message = absl::StrCat(AbslView(what), ": ", std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case EDQUOT:
    case ENOBUFS:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOENT:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EINVAL:
    case EBADF:
    case EMSGSIZE:
      return absl::InvalidArgumentError(message);
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
      return absl::UnavailableError(message);
    case ETIMEDOUT:
    case EAGAIN:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace tensord::common
