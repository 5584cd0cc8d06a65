// Checking a call's arguments: everything is checked before anything is written, so that a
// refused call leaves the buffers and the communicator as they were.
#pragma once

#include <cstddef>

#include "enqueue.h"

namespace mncl {

// Throws the communicator's stored error if it failed (inside a CPU group: see validate.cc).
void checkUsable(Comm& comm);
// A known type, and for a reducing call a known op that can combine it.
void checkTypeOp(DataType t, RedOp op, bool reduces);
// `count` elements of `t`, `blocks` times (a rank's block for each rank, where a buffer holds
// one), must be a size a buffer can have.
void checkBytes(const char* what, size_t count, DataType t, size_t blocks);
// A collective's or a send's / receive's arguments, each with the message of what is wrong.
void validate(Comm& comm, const CollCall& c);
void validate(Comm& comm, const P2pCall& c);

}  // namespace mncl
