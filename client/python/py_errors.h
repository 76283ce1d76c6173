// Status -> Python exception translation for the tensord module: the one place where a
// tensord::Status becomes a Python exception.
//
// Exception classes (created by RegisterErrors, exported as tensord.<Name>):
//   Error (base, Exception) with .code ("NOT_FOUND", ...) and .message (the broker's text)
//   NotFound, Timeout (DEADLINE_EXCEEDED), ResourceExhausted, PermissionDenied,
//   InvalidArgument, Unavailable; any other code raises Error itself with its .code.
// Binding code throws StatusError (or calls Unwrap) and the registered translator raises the
// matching class. Must be used with the GIL held.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include <pybind11/pybind11.h>

#include "tensord/status.h"

namespace tensord::python {

class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return status_.message().c_str(); }

 private:
  Status status_;
};

// Creates the exception classes in `m` and registers the translator.
void RegisterErrors(pybind11::module_& m);

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T Unwrap(Result<T>&& result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

}  // namespace tensord::python
