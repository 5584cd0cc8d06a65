// Ctrl-C during a call that blocks on its peers.
//
// Python runs signal handlers on its main thread only, between bytecodes; a call waiting
// for its peers without the GIL would never let one run, so Ctrl-C did nothing until the
// peers came (maybe never). While an InterruptibleCall lives, the calling thread's long waits
// (dev::tlsLongWaitHook) take the GIL every few tens of milliseconds and run the pending
// handlers, on the main thread (socket waits of an init, every 100 ms, do the same). When one
// raises (KeyboardInterrupt), `stop` ends the call's waits: it fails the communicators the
// call runs on, which tells the peers (they raise RemoteError), or cancels an init's socket
// waits. The call then raises the handler's exception, not Aborted. The communicator stays
// failed: its peers are somewhere inside the call it left.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "../../cuda/arch.h"

namespace mncl::py_interrupt {

namespace py = pybind11;

class InterruptibleCall {
 public:
  // stop(why): fails the call's communicators with `why`. Built with the GIL held.
  explicit InterruptibleCall(std::function<void(const std::string& why)> stop);
  ~InterruptibleCall();
  InterruptibleCall(const InterruptibleCall&) = delete;
  InterruptibleCall& operator=(const InterruptibleCall&) = delete;

  // With the GIL: raises the handler's exception, if one was raised during the call.
  void rethrowIfInterrupted();

  // For a wait that holds the GIL between timed waits (Work.wait): runs the pending
  // handlers now; if one raised, stops the call and raises its exception.
  void checkNow();

 private:
  static void poll(void* self);
  void runHandlers();  // with the GIL

  std::function<void(const std::string&)> stop_;
  dev::LongWaitHook saved_;
  std::chrono::steady_clock::time_point nextPoll_{};
  std::optional<py::error_already_set> raised_;
};

}  // namespace mncl::py_interrupt
