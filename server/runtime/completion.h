// Completion<T>: how the broker answers a call that may finish later (on the executor, when
// a wait is granted or times out). It is called exactly once, with the result or the error,
// and never under the broker's mutex.
#pragma once

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"

namespace tensord::server {

template <typename T>
using Completion = absl::AnyInvocable<void(absl::StatusOr<T>) &&>;

}  // namespace tensord::server
