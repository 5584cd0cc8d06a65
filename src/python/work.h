// minincl.Work: the handle an async_op=True call returns. Each such call is one Work, run in
// order by its communicator's AsyncQueue (async_queue.h).
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <functional>
#include <memory>
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
  py::object wait() {
    py_interrupt::InterruptibleCall interruptible([this](const std::string& why) { stop_(why); });
    for (;;) {
      {
        py_gil::Released nogil;
        if (state_->waitFor(std::chrono::milliseconds(50))) break;
      }
      interruptible.checkNow();
    }
    if (state_->code() != mnclSuccess) py_errors::raise(state_->code(), state_->message());
    return result_;
  }
  bool isCompleted() { return state_->done(); }
  py::object result() { return result_; }

 private:
  std::shared_ptr<Outcome> state_;
  py::object result_;
  py::list keep_;  // the arrays, alive until the work is gone
  Stop stop_;
};

}  // namespace mncl::py_async
