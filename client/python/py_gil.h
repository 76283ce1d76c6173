// WithoutGil(f): runs a blocking call into the client library with the GIL released.
// GilRelease: the scope that does it.
//
// A Python daemon thread may be inside such a call when the interpreter finalizes. Taking
// the GIL back then makes CPython end the thread with pthread_exit, whose forced unwind
// through C++ frames (noexcept destructors, pybind11's dispatcher) aborts the whole process
// ("terminate called without an active exception"). So a thread other than the one
// finalizing (the main thread) that comes back from the broker during finalization parks for
// good instead: the process is exiting and takes the thread with it.
#pragma once

#include <Python.h>

#include <utility>

namespace tensord::python {

// Records the main thread; call once at module import.
void InitGilRelease();

// True while the interpreter finalizes and this is not the thread finalizing it.
bool MustNotReturnToPython();

[[noreturn]] void ParkForever();

// True on the thread that runs Python's signal handlers (the main thread): only there can a
// signal handler raise (KeyboardInterrupt) into a wait.
bool HandlesSignals();

// Called without the GIL, from inside a call WithoutGil runs: takes the GIL for a moment and
// runs the signal handlers of signals that arrived (PyErr_CheckSignals). True when one raised;
// its exception stays set for the caller to throw once the call returned (error_already_set).
bool SignalHandlerRaised();

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

// Runs f() with the GIL released and returns its result once the GIL is held again.
//
// f must not touch Python objects (no pybind11 calls, no Python exceptions). Errors come back
// as values: f returns the Status or Result<T>, and the caller checks it after WithoutGil
// returns, with the GIL held (ThrowIfError, Unwrap). Whatever f does throw (std::bad_alloc,
// a StatusError) never reaches the caller without the GIL: the GilRelease below takes it
// back as the exception unwinds out of here, so pybind11 translates it as usual. Likewise
// f's result is built before the GIL is retaken and destroyed after, with the GIL held.
template <typename F>
auto WithoutGil(F&& f) {
  GilRelease release;
  return std::forward<F>(f)();
}

}  // namespace tensord::python
