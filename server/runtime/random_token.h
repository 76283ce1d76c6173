// Bearer secrets the broker hands out (session tokens, hand-over tokens): random bits from
// getrandom(2), as hex digits. Never log one.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tensord::server {

// `bytes` random bytes (at most 64) as 2 * bytes hex digits; `what` names the token in an
// error (getrandom failing is the only one).
absl::StatusOr<std::string> NewRandomToken(size_t bytes, std::string_view what);

}  // namespace tensord::server
