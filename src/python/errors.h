// minincl's errors as Python sees them: a result code names its class in minincl.errors.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "minincl.h"

namespace mncl::py_errors {

namespace py = pybind11;

// minincl.errors.<Class> of `code` (minincl.errors.Error for a code without its own class).
py::object errorClass(mnclResult_t code);

// Raises minincl.errors.<Class>(msg): sets the Python error and throws error_already_set.
[[noreturn]] void raise(mnclResult_t code, const std::string& msg);

}  // namespace mncl::py_errors
