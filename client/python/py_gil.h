// GilRelease: releases the GIL around a blocking call into the client library.
//
// A Python daemon thread may be inside such a call when the interpreter finalizes. Taking
// the GIL back then makes CPython end the thread with pthread_exit, whose forced unwind
// through C++ frames (noexcept destructors, pybind11's dispatcher) aborts the whole process
// ("terminate called without an active exception"). So a thread other than the one
// finalizing (the main thread) that comes back from the broker during finalization parks for
// good instead: the process is exiting and takes the thread with it.
#pragma once

#include <Python.h>

namespace tensord::python {

// Records the main thread; call once at module import.
void InitGilRelease();

// True while the interpreter finalizes and this is not the thread finalizing it.
bool MustNotReturnToPython();

[[noreturn]] void ParkForever();

class GilRelease {
 public:
  GilRelease() : state_(PyEval_SaveThread()) {}
  ~GilRelease() {
    if (MustNotReturnToPython()) ParkForever();
    PyEval_RestoreThread(state_);
  }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace tensord::python
