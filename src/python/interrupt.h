// Ctrl-C during a call that blocks on its peers.
//
// Python runs signal handlers on its main thread only, between bytecodes; a call waiting
// for its peers without the GIL would never let one run, so Ctrl-C did nothing until the
// peers came (maybe never). While an InterruptibleCall lives on the main thread, its long
// waits (dev::tlsLongWaitHook) take the GIL every few tens of milliseconds and run the pending
// handlers (socket waits of an init, every 100 ms, do the same). Other threads never take it
// there: no handler would run, and a daemon thread that takes the GIL while the interpreter
// exits is ended by force, through frames that do not expect it (the process aborted). When one
// raises (KeyboardInterrupt), `stop` ends the call's waits: it fails the communicators the
// call runs on, which tells the peers (they raise RemoteError), or cancels an init's socket
// waits. The call then raises the handler's exception, not Aborted. The communicator stays
// failed: its peers are somewhere inside the call it left.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <optional>
#include <string>
#include <type_traits>

#include "../../cuda/arch.h"
#include "gil.h"

namespace mncl::py_interrupt {

namespace py = pybind11;

// Remembers which thread is Python's main one (at import: threading.main_thread()).
void rememberMainThread();
bool onMainThread();

// The part that does not depend on how a call stops (in interrupt.cc).
class InterruptibleCallBase {
 public:
  InterruptibleCallBase(const InterruptibleCallBase&) = delete;
  InterruptibleCallBase& operator=(const InterruptibleCallBase&) = delete;

  // With the GIL: raises the handler's exception, if one was raised during the call.
  void rethrowIfInterrupted() {
    if (raised_) rethrow();
  }

  // Runs body() without the GIL and returns what it returns. If a handler raised meanwhile,
  // raises that exception instead, also when body threw: its error (Aborted) is the
  // interruption's consequence, not its story.
  template <typename Body>
  auto withoutGil(Body&& body) -> decltype(body()) {
    auto run = [&]() -> decltype(body()) {
      try {
        return py_gil::withoutGil(body);
      } catch (...) {
        rethrowIfInterrupted();  // (with the GIL again)
        throw;
      }
    };
    if constexpr (std::is_void_v<decltype(body())>) {
      run();
      rethrowIfInterrupted();
    } else {
      auto result = run();
      rethrowIfInterrupted();
      return result;
    }
  }

  // For a wait that holds the GIL between timed waits (Work.wait): runs the pending
  // handlers now; if one raised, stops the call and raises its exception.
  void checkNow();

  // With the GIL, once the call has returned: a signal that came while it was busy (copying
  // or reducing, where no wait polls) has its handler run here, not at Python's next
  // bytecode. If that raises, `stop(why)` fails the call's communicators as for an
  // interrupted wait (otherwise the peers would wait in their next call for a rank that has
  // gone elsewhere), and the exception is raised. The call has left them by now, and the
  // handler may have closed them: `stop` must check.
  template <typename Stop>
  void checkAfterReturn(Stop&& stop) {
    if (!hook_ || raised_) return;
    std::string why = runHandlers("as it ended");
    if (!why.empty()) stop(why);
    rethrowIfInterrupted();
  }

 protected:
  using StopFn = void (*)(InterruptibleCallBase* self, const std::string& why);
  explicit InterruptibleCallBase(StopFn stop) : stop_(stop) {
    if (!onMainThread()) return;
    hook_ = &dev::tlsLongWaitHook;
    saved_ = *hook_;
    *hook_ = {&InterruptibleCallBase::poll, this};
  }
  ~InterruptibleCallBase() {
    if (hook_) *hook_ = saved_;
  }

 private:
  static void poll(void* self);
  [[noreturn]] void rethrow();
  // With the GIL: runs the pending handlers; if one raised, keeps its exception and returns
  // why the call stops (for the peers; `when` ends it), else "".
  std::string runHandlers(const char* when);

  StopFn stop_;
  dev::LongWaitHook* hook_ = nullptr;  // this thread's (looked up once: another library's thread-local)
  dev::LongWaitHook saved_{};
  std::chrono::steady_clock::time_point nextPoll_{};
  std::optional<py::error_already_set> raised_;
};

// stop(why) fails the call's communicators (or cancels its socket waits) with `why`. A
// template rather than a std::function: every synchronous call makes one (~25 ns a call
// with std::function and two thread-local lookups, 5% of a one-rank allreduce).
template <typename Stop>
class InterruptibleCall : public InterruptibleCallBase {
 public:
  explicit InterruptibleCall(Stop stop) : InterruptibleCallBase(&InterruptibleCall::callStop), stop_(std::move(stop)) {}

 private:
  static void callStop(InterruptibleCallBase* self, const std::string& why) {
    static_cast<InterruptibleCall*>(self)->stop_(why);
  }
  Stop stop_;
};

}  // namespace mncl::py_interrupt
