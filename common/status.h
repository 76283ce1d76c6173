// Status helpers used across tensord's internal modules (absl::Status with canonical codes).
// Messages name the object and the cause; they never contain tokens or handles.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tensord::common {

// Debian's abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW
// is 0), so absl::StrCat, StrJoin and CHexEscape do not accept a std::string_view: pass
// AbslView(s). It copies nothing.
inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

// Wraps a failed syscall: "<what>: <strerror> (errno N)", with the code that fits errno
// (ENOMEM/ENOSPC/EMFILE/ENFILE -> RESOURCE_EXHAUSTED, EACCES/EPERM -> PERMISSION_DENIED, ...).
absl::Status ErrnoToStatus(std::string_view what, int err);

// Returns early from the enclosing function when `expr` (an absl::Status) is not OK.
#define TENSORD_RETURN_IF_ERROR(expr)               \
  do {                                              \
    if (absl::Status tensord_status_ = (expr);      \
        !tensord_status_.ok()) {                    \
      return tensord_status_;                       \
    }                                               \
  } while (false)

#define TENSORD_STATUS_CONCAT_INNER(a, b) a##b
#define TENSORD_STATUS_CONCAT(a, b) TENSORD_STATUS_CONCAT_INNER(a, b)

// `TENSORD_ASSIGN_OR_RETURN(auto x, StatusOrExpr());`
#define TENSORD_ASSIGN_OR_RETURN(lhs, expr) \
  TENSORD_ASSIGN_OR_RETURN_IMPL(TENSORD_STATUS_CONCAT(tensord_statusor_, __LINE__), lhs, expr)
#define TENSORD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

}  // namespace tensord::common
