// The minincl.group() a thread has open, as the module keeps it until group_end.
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

namespace mncl::py_comm {

class PyComm;

// What this thread's open group holds until it ends: its calls' arrays (and the
// communicators' Python objects), alive until the calls ran, and the communicators the calls
// were recorded on, held open while the group runs.
struct PyGroup {
  std::vector<pybind11::object> keep;
  std::vector<PyComm*> comms;
};
inline thread_local PyGroup* tlsGroup = nullptr;

}  // namespace mncl::py_comm
