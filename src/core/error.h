// Errors inside the runtime are exceptions carrying an mnclResult_t and a sentence that says
// what was wrong and what to do; the C API catches them at its boundary, returns the code and
// keeps the sentence for mnclGetLastError.
#pragma once

#include <stdexcept>
#include <string>

#include "minincl.h"

namespace mncl {

class Error : public std::runtime_error {
 public:
  Error(mnclResult_t code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  mnclResult_t code() const { return code_; }

 private:
  mnclResult_t code_;
};

[[noreturn]] void throwError(mnclResult_t code, const std::string& msg);
[[noreturn]] void throwSystemError(const std::string& what);  // appends strerror(errno)

// Throws when `ok` is false; the message is only built then (checks sit on the hot path).
#define MNCL_CHECK(ok, code, msg)                    \
  do {                                               \
    if (!(ok)) ::mncl::throwError((code), (msg));    \
  } while (0)

// The last error sentence of this thread (mnclGetLastError with a null comm).
void setThreadLastError(const std::string& msg);
const char* threadLastError();

}  // namespace mncl
