#include "py_gil.h"

#include <unistd.h>

#include <atomic>

namespace tensord::python {
namespace {

std::atomic<unsigned long> g_main_thread{0};

}  // namespace

void InitGilRelease() {
  // threading.main_thread().ident is the PyThread ident of the thread that finalizes.
  PyObject* threading = PyImport_ImportModule("threading");
  if (threading == nullptr) {
    PyErr_Clear();
    return;
  }
  PyObject* main = PyObject_CallMethod(threading, "main_thread", nullptr);
  if (main != nullptr) {
    PyObject* ident = PyObject_GetAttrString(main, "ident");
    if (ident != nullptr) {
      g_main_thread = PyLong_AsUnsignedLong(ident);
      Py_DECREF(ident);
    }
    Py_DECREF(main);
  }
  Py_DECREF(threading);
  PyErr_Clear();
}

bool MustNotReturnToPython() {
  return _Py_IsFinalizing() && PyThread_get_thread_ident() != g_main_thread.load();
}

bool HandlesSignals() { return PyThread_get_thread_ident() == g_main_thread.load(); }

bool SignalHandlerRaised() {
  if (MustNotReturnToPython()) ParkForever();
  PyGILState_STATE gil = PyGILState_Ensure();
  const bool raised = PyErr_CheckSignals() != 0;
  PyGILState_Release(gil);
  return raised;
}

void ParkForever() {
  for (;;) pause();
}

}  // namespace tensord::python
