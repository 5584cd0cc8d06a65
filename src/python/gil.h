// The GIL released for a scope, as py::gil_scoped_release, but safe at interpreter exit.
//
// A daemon thread that retakes the GIL while the interpreter finalizes is ended by force
// (pthread_exit) inside the retaking, here a destructor, which C++ answers by aborting the
// process ("terminate called without an active exception"): a minincl call returning on a
// daemon thread as the main thread exits killed the process with SIGABRT. Such a thread
// parks instead, as Python 3.14 parks its own, until the process is gone. (Not the main
// thread: it is the one finalizing, and retakes the GIL as it destroys communicators.)
#pragma once

#include <Python.h>
#include <unistd.h>

namespace mncl::py_interrupt {
bool onMainThread();  // (interrupt.cc)
}

namespace mncl::py_gil {

inline bool interpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

class Released {
 public:
  Released() : state_(PyEval_SaveThread()) {}
  // Not noexcept: should finalization begin while this waits for the GIL, Python ends the
  // thread by unwinding it (pthread_exit), which must pass through here.
  ~Released() noexcept(false) {
    while (interpreterFinalizing() && !py_interrupt::onMainThread()) pause();  // (for good)
    PyEval_RestoreThread(state_);
  }
  Released(const Released&) = delete;
  Released& operator=(const Released&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace mncl::py_gil
