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

#include <exception>
#include <optional>
#include <type_traits>

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

inline void retake(PyThreadState* state) {
  while (interpreterFinalizing() && !py_interrupt::onMainThread()) pause();  // (for good)
  PyEval_RestoreThread(state);
}

// Runs f() without the GIL, and retakes it in ordinary code, also when f threw (the
// exception waits meanwhile): should finalization begin while the thread waits for the GIL,
// Python ends it by unwinding (pthread_exit), which must not start in a destructor that runs
// because of another exception (std::terminate).
template <typename F>
auto withoutGil(F&& f) -> decltype(f()) {
  using R = decltype(f());
  PyThreadState* state = PyEval_SaveThread();
  std::exception_ptr error;
  if constexpr (std::is_void_v<R>) {
    try {
      f();
    } catch (...) {
      error = std::current_exception();
    }
    retake(state);
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<R> result;
    try {
      result.emplace(f());
    } catch (...) {
      error = std::current_exception();
    }
    retake(state);
    if (error) std::rethrow_exception(error);
    return std::move(*result);
  }
}

// A scope without the GIL, where no exception leaves it (else prefer withoutGil).
class Released {
 public:
  Released() : state_(PyEval_SaveThread()) {}
  // Not noexcept: should finalization begin while this waits for the GIL, Python ends the
  // thread by unwinding it (pthread_exit), which must pass through here.
  ~Released() noexcept(false) { retake(state_); }
  Released(const Released&) = delete;
  Released& operator=(const Released&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace mncl::py_gil
