#include "errors.h"

namespace mncl::py_errors {

py::object errorClass(mnclResult_t code) {
  py::module_ errors = py::module_::import("minincl.errors");
  switch (code) {
    case mnclInvalidArgument: return errors.attr("InvalidArgument");
    case mnclInvalidUsage: return errors.attr("InvalidUsage");
    case mnclSystemError: return errors.attr("SystemError");
    case mnclRemoteError: return errors.attr("RemoteError");
    case mnclTimeout: return errors.attr("Timeout");
    case mnclAborted: return errors.attr("Aborted");
    default: return errors.attr("Error");
  }
}

void raise(mnclResult_t code, const std::string& msg) {
  py::object cls = errorClass(code);
  PyErr_SetString(cls.ptr(), msg.c_str());
  throw py::error_already_set();
}

}  // namespace mncl::py_errors
