// The per-call methods (the collectives, send, recv) bound with CPython's own fast calling
// convention instead of through pybind11's dispatcher.
//
// pybind11 finds each keyword parameter by building and interning a Python string from its C
// name on every call (~0.1 us a parameter): comm.broadcast(x, root=0) took 1.03 us on a
// one-rank communicator against 0.55 us for comm.broadcast(x, None, 0), and an 8-byte
// broadcast between two processes 1.29 us in all. These methods take CPython's vectorcall
// arguments (METH_FASTCALL | METH_KEYWORDS: no tuple or dict is built) and read them through
// a Signature, whose names are interned once, so keywords match by pointer as in CPython's
// own argument parsing.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace mncl::py_args {

namespace py = pybind11;

// A method's parameters after self, written as in Python ("send", "recv=None", "op='sum'"),
// those without a default first. The text is also where Args finds the defaults ('str', int,
// True / False, None), so the docstring and the behaviour cannot disagree. The names are
// interned on first use (under the GIL).
class Signature {
 public:
  Signature(const char* method, std::initializer_list<const char*> params);
  const char* method() const { return method_; }
  int size() const { return (int)names_.size(); }
  const char* name(int i) const { return names_[i].c_str(); }
  int required() const { return required_; }
  // Parameter i's default, as its literal reads ("'sum'" -> "sum", "0" -> 0, "True" -> true).
  struct Default {
    std::string text;
    int integer = 0;
    bool flag = false;
  };
  const Default& defaultOf(int i) const { return defaults_[i]; }
  // The parameter named `name` (interned or not), or -1.
  int find(PyObject* name) const;
  // "method($self, send, recv=None, ...)\n--\n\n": how a docstring starts for help() and
  // inspect.signature to show the parameters.
  std::string docHeader() const;

 private:
  const char* method_;
  std::vector<std::string> params_, names_;
  std::vector<Default> defaults_;
  int required_ = 0;
  mutable std::vector<PyObject*> interned_;  // kept for the life of the process
};

// One call's arguments, by parameter position. A bad call (too many arguments, an unknown or
// repeated keyword, a required one missing, a wrong type) raises TypeError, as Python would.
class Args {
 public:
  static constexpr size_t kMaxParams = 8;
  Args(const Signature& sig, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);
  // The argument, or its default where it was not given (object: None).
  py::object object(int i) const;
  std::string text(int i) const;
  int integer(int i) const;
  std::optional<int> integerOrNone(int i) const;  // (None, or not given: empty)
  bool flag(int i) const;

 private:
  [[noreturn]] void wrongType(int i, const char* expected) const;
  const Signature& sig_;
  PyObject* given_[kMaxParams] = {};  // borrowed from the caller's frame, which outlives this
};

using FastMethod = PyObject* (*)(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);

// Adds `method` to `cls` under the signature's name, its docstring `doc` after the signature.
void addMethod(py::handle cls, const Signature& sig, FastMethod method, const char* doc);

// Runs a method body, turning C++ exceptions into Python errors; what pybind11's dispatcher
// does for the methods bound through it. `translate` sets the error for anything else the
// body may throw, and returns false if it does not know it. (Not noexcept: a daemon thread
// that Python ends at exit unwinds through here, see gil.h.)
template <typename Body, typename Translate>
PyObject* guarded(Body body, Translate translate) {
  try {
    return body().release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    if (!translate(e)) PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

}  // namespace mncl::py_args
