#include "call_args.h"

#include <cctype>
#include <climits>
#include <stdexcept>

namespace mncl::py_args {

Signature::Signature(const char* method, std::initializer_list<const char*> params)
    : method_(method), params_(params.begin(), params.end()) {
  if (params.size() > Args::kMaxParams) throw std::logic_error(std::string(method) + ": too many parameters for Args");
  for (const std::string& p : params_) {
    size_t eq = p.find('=');
    names_.push_back(p.substr(0, eq));
    Default d;
    if (eq == std::string::npos) {
      ++required_;
    } else {
      std::string literal = p.substr(eq + 1);
      if (literal.size() >= 2 && literal.front() == '\'') d.text = literal.substr(1, literal.size() - 2);
      if (!literal.empty() && (std::isdigit((unsigned char)literal[0]) || literal[0] == '-')) d.integer = std::stoi(literal);
      d.flag = literal == "True";
    }
    defaults_.push_back(d);
  }
}

int Signature::find(PyObject* name) const {
  if (interned_.empty()) {
    for (const std::string& n : names_) interned_.push_back(PyUnicode_InternFromString(n.c_str()));
  }
  for (size_t i = 0; i < interned_.size(); ++i) {
    if (interned_[i] == name) return (int)i;
  }
  for (size_t i = 0; i < interned_.size(); ++i) {  // a keyword built at run time, not interned
    if (PyUnicode_Compare(interned_[i], name) == 0) return (int)i;
  }
  PyErr_Clear();
  return -1;
}

std::string Signature::docHeader() const {
  std::string s = std::string(method_) + "($self";
  for (const std::string& p : params_) s += ", " + p;
  return s + ")\n--\n\n";
}

Args::Args(const Signature& sig, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) : sig_(sig) {
  auto where = [&] { return std::string(sig.method()) + "()"; };  // (built only for an error)
  nargs = PyVectorcall_NARGS(nargs);
  if (nargs > sig.size()) {
    throw py::type_error(where() + " takes at most " + std::to_string(sig.size()) + " arguments (" +
                         std::to_string(nargs) + " given)");
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) given_[i] = args[i];
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {  // keyword values follow the positional ones
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    int i = sig.find(key);
    if (i < 0) {
      throw py::type_error(where() + " got an unexpected keyword argument '" + std::string(py::str(key)) + "'");
    }
    if (given_[i]) throw py::type_error(where() + " got multiple values for argument '" + sig.name(i) + "'");
    given_[i] = args[nargs + k];
  }
  for (int i = 0; i < sig.required(); ++i) {
    if (!given_[i]) throw py::type_error(where() + " missing required argument '" + sig.name(i) + "'");
  }
}

py::object Args::object(int i) const {
  return given_[i] ? py::reinterpret_borrow<py::object>(given_[i]) : py::none();
}

std::string Args::text(int i) const {
  if (!given_[i]) return sig_.defaultOf(i).text;
  Py_ssize_t len = 0;
  const char* s = PyUnicode_Check(given_[i]) ? PyUnicode_AsUTF8AndSize(given_[i], &len) : nullptr;
  if (!s) {
    PyErr_Clear();
    wrongType(i, "a str");
  }
  return std::string(s, (size_t)len);
}

int Args::integer(int i) const {
  if (!given_[i]) return sig_.defaultOf(i).integer;
  if (PyBool_Check(given_[i]) || !PyIndex_Check(given_[i])) wrongType(i, "an int");
  long v = PyLong_AsLong(given_[i]);  // through __index__: NumPy integers too
  if ((v == -1 && PyErr_Occurred()) || v < INT_MIN || v > INT_MAX) {
    PyErr_Clear();
    throw py::type_error(std::string(sig_.method()) + "(): '" + sig_.name(i) + "' is out of range for a C int");
  }
  return (int)v;
}

std::optional<int> Args::integerOrNone(int i) const {
  if (!given_[i] || given_[i] == Py_None) return std::nullopt;
  return integer(i);
}

bool Args::flag(int i) const {
  if (!given_[i]) return sig_.defaultOf(i).flag;
  int v = PyObject_IsTrue(given_[i]);
  if (v < 0) {
    PyErr_Clear();
    wrongType(i, "a bool");
  }
  return v != 0;
}

void Args::wrongType(int i, const char* expected) const {
  throw py::type_error(std::string(sig_.method()) + "(): '" + sig_.name(i) + "' must be " + expected + ", not " +
                       std::string(py::str(py::type::handle_of(given_[i]).attr("__name__"))));
}

void addMethod(py::handle cls, const Signature& sig, FastMethod method, const char* doc) {
  // CPython keeps pointers to the definition and its strings for as long as the method
  // exists: the process.
  auto* text = new std::string(sig.docHeader() + doc);
  auto* def = new PyMethodDef{sig.method(), reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(method)),
                              METH_FASTCALL | METH_KEYWORDS, text->c_str()};
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  py::object descr = py::reinterpret_steal<py::object>(PyDescr_NewMethod(type, def));
  if (!descr) throw py::error_already_set();
  py::setattr(cls, sig.method(), descr);
}

}  // namespace mncl::py_args
