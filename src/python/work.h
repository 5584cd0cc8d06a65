// minincl.Work: the handle an async_op=True call returns. Each such call is one Work, run in
// order by its communicator's AsyncQueue (async_queue.h).
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "../core/outcome.h"
#include "errors.h"
#include "gil.h"
#include "interrupt.h"

namespace mncl::py_async {

namespace py = pybind11;

class Work {
 public:
  using Stop = std::function<void(const std::string& why)>;
  // stop: fails the communicator, for a wait() that Ctrl-C interrupts (see py_interrupt).
  Work(std::shared_ptr<Outcome> s, py::object result, py::list keep, Stop stop)
      : state_(std::move(s)), result_(std::move(result)), keep_(std::move(keep)), stop_(std::move(stop)) {}
  // timeout: seconds, or none for as long as it takes; past it, minincl.Timeout, and the
  // operation goes on (a later wait can still see it end).
  py::object wait(std::optional<double> timeout) {
    using Clock = std::chrono::steady_clock;
    if (timeout && !(*timeout < 1e9)) timeout.reset();  // (past any run: no limit, and no overflow)
    const auto deadline = timeout ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(std::max(*timeout, 0.0)))
                                  : Clock::time_point::max();
    py_interrupt::InterruptibleCall interruptible([this](const std::string& why) { stop_(why); });
    for (;;) {
      {
        py_gil::Released nogil;
        auto slice = std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - Clock::now());
        if (state_->waitFor(std::max(slice, Clock::duration::zero()))) break;
      }
      interruptible.checkNow();
      if (Clock::now() >= deadline) {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%g", *timeout);
        py_errors::raise(mnclTimeout, std::string("the async_op call did not finish within ") + seconds +
                                          " s (it goes on: wait again, or abort the communicator)");
      }
    }
    releaseArrays();
    if (state_->code() != mnclSuccess) py_errors::raise(state_->code(), state_->message());
    return result_;
  }
  bool isCompleted() {
    if (!state_->done()) return false;
    releaseArrays();
    return true;
  }

 private:
  // Lets go of the arrays once the operation has ended: a buffer-protocol array's export
  // (arrays.cc, holdExport) would otherwise refuse a resize for as long as the Work lives.
  // The list is shared with the communicator's record of running works (PyComm::asyncHeld_).
  void releaseArrays() {
    if (PyList_GET_SIZE(keep_.ptr()) > 0) PyList_SetSlice(keep_.ptr(), 0, PY_SSIZE_T_MAX, nullptr);
  }

  std::shared_ptr<Outcome> state_;
  py::object result_;
  py::list keep_;  // the arrays, alive until the operation ends
  Stop stop_;
};

}  // namespace mncl::py_async
