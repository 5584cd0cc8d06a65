// The Communicator's per-call methods (the collectives, send, recv), on CPython's fast
// calling convention (see call_args.h): each is its Signature and a function of the parsed
// arguments that calls PyComm.
#pragma once

#include <pybind11/pybind11.h>

namespace mncl::py_comm {

// Adds the per-call methods to the Communicator class `comm`.
void bindCalls(pybind11::handle comm);

}  // namespace mncl::py_comm
