#include "error.h"

#include <cerrno>
#include <cstring>

namespace mncl {

namespace {
thread_local std::string tlsLastError;
}

void throwError(mnclResult_t code, const std::string& msg) { throw Error(code, msg); }

void throwSystemError(const std::string& what) {
  throw Error(mnclSystemError, what + ": " + std::strerror(errno));
}

void setThreadLastError(const std::string& msg) { tlsLastError = msg; }
const char* threadLastError() { return tlsLastError.c_str(); }

}  // namespace mncl
