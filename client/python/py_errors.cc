#include "py_errors.h"

#include <Python.h>

namespace tensord::python {
namespace {

namespace py = pybind11;

// Owned by the module for the life of the process (never freed: exceptions may be raised
// until the interpreter is gone).
PyObject* g_error = nullptr;
PyObject* g_not_found = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_resource_exhausted = nullptr;
PyObject* g_permission_denied = nullptr;
PyObject* g_invalid_argument = nullptr;
PyObject* g_unavailable = nullptr;

// `also`: a builtin exception the class also derives from, so that code written for the
// builtin catches it (except TimeoutError, except LookupError).
PyObject* NewClass(py::module_& m, const char* name, PyObject* base, const char* doc, PyObject* also = nullptr) {
  std::string qualified = std::string("tensord.") + name;
  py::object bases = also == nullptr ? py::reinterpret_borrow<py::object>(base)
                                     : py::make_tuple(py::handle(base), py::handle(also));
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;  // the reference from PyErr_NewExceptionWithDoc is kept forever
}

PyObject* ClassFor(StatusCode code) {
  switch (code) {
    case StatusCode::kNotFound: return g_not_found;
    case StatusCode::kDeadlineExceeded: return g_timeout;
    case StatusCode::kResourceExhausted: return g_resource_exhausted;
    case StatusCode::kPermissionDenied: return g_permission_denied;
    case StatusCode::kInvalidArgument: return g_invalid_argument;
    case StatusCode::kUnavailable: return g_unavailable;
    default: return g_error;
  }
}

void Raise(const Status& status) {
  PyObject* cls = ClassFor(status.code());
  py::str message(status.message());
  PyObject* exc = PyObject_CallOneArg(cls, message.ptr());
  if (exc == nullptr) return;  // the call's own exception stays set
  if (PyObject_SetAttrString(exc, "code", py::str(StatusCodeName(status.code())).ptr()) != 0 ||
      PyObject_SetAttrString(exc, "message", message.ptr()) != 0) {
    Py_DECREF(exc);
    return;
  }
  PyErr_SetObject(cls, exc);
  Py_DECREF(exc);
}

}  // namespace

void RegisterErrors(py::module_& m) {
  g_error = NewClass(m, "Error", PyExc_Exception,
                     "A tensord call failed. .code is the canonical status code name "
                     "('NOT_FOUND', ...), .message the broker's explanation.");
  g_not_found = NewClass(m, "NotFound", g_error,
                         "The name or tensor does not exist (NOT_FOUND). Also a LookupError.", PyExc_LookupError);
  g_timeout = NewClass(m, "Timeout", g_error,
                       "A wait ran out (DEADLINE_EXCEEDED). Also a TimeoutError.", PyExc_TimeoutError);
  g_resource_exhausted = NewClass(m, "ResourceExhausted", g_error,
                                  "A quota or the node's memory is exhausted.");
  g_permission_denied = NewClass(m, "PermissionDenied", g_error,
                                 "The namespace's ACL or the daemon's identity refused it.");
  g_invalid_argument = NewClass(m, "InvalidArgument", g_error,
                                "A name, shape, dtype or option was refused.");
  g_unavailable = NewClass(m, "Unavailable", g_error, "No broker answers on the socket.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      Raise(e.status());
    }
  });
}

}  // namespace tensord::python
