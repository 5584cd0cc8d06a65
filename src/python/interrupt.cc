#include "interrupt.h"

namespace mncl::py_interrupt {

namespace {

// How often a blocked call looks for a signal: Ctrl-C answered within a tenth of a second,
// and the GIL taken no more than 20 times a second.
constexpr auto kPollPeriod = std::chrono::milliseconds(50);

unsigned long mainThreadIdent = 0;

}  // namespace

void rememberMainThread() {
  mainThreadIdent = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
}

bool onMainThread() { return PyThread_get_thread_ident() == mainThreadIdent; }

void InterruptibleCallBase::poll(void* self) {
  auto* call = static_cast<InterruptibleCallBase*>(self);
  auto now = std::chrono::steady_clock::now();
  if (call->raised_ || now < call->nextPoll_) return;
  call->nextPoll_ = now + kPollPeriod;
  py::gil_scoped_acquire gil;
  std::string why = call->runHandlers("while it waited for its peers");
  if (!why.empty()) call->stop_(call, why);
}

std::string InterruptibleCallBase::runHandlers(const char* when) {
  // (Off the main thread, PyErr_CheckSignals does nothing. It must be the first Python this
  // runs: any Python code would run the handler itself, and its exception be lost.)
  if (raised_ || PyErr_CheckSignals() == 0) return "";
  raised_.emplace();  // takes the handler's exception
  const char* name = reinterpret_cast<PyTypeObject*>(raised_->type().ptr())->tp_name;
  return std::string("the call was interrupted (") + name + ") " + when;
}

void InterruptibleCallBase::rethrow() {
  py::error_already_set e = std::move(*raised_);
  raised_.reset();
  throw e;
}

void InterruptibleCallBase::checkNow() {
  std::string why = runHandlers("while it waited for its peers");
  if (!why.empty()) stop_(this, why);
  rethrowIfInterrupted();
}

}  // namespace mncl::py_interrupt
