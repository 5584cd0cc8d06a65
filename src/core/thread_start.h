// Starting a thread. One that cannot start (a limit on threads, processes or address space:
// `ulimit -u`, `ulimit -v`, a container's pids limit) throws std::system_error, which read as
// an internal error (C API) or as a RuntimeError that is no minincl.Error (Python): here it is
// a SystemError that says what the thread was for and which limit to look at.
#pragma once

#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "error.h"

namespace mncl {

template <typename... Args>
std::thread startThread(const char* purpose, Args&&... args) {
  try {
    return std::thread(std::forward<Args>(args)...);
  } catch (const std::system_error& e) {
    throw Error(mnclSystemError, std::string("could not start ") + purpose + " (" + e.what() +
                                     "): is a limit on threads, processes or memory reached (ulimit -u, ulimit -v; a "
                                     "container's pids limit)?");
  }
}

}  // namespace mncl
