// Memory a C caller asks a communicator for (mnclCommMemAlloc, NCCL's ncclMemAlloc plus a
// registered buffer): space in the communicator's window, which every peer process mapped at
// init, so that collectives on it skip the FIFO's copies. Where the communicator has no use
// for a window (its peers are threads of this process, or hosts away), plain memory: the
// same calls are as fast there without one.
//
// An allocation holds its window: the memory stays valid until mnclMemFree, even after the
// communicator is destroyed (as NCCL's outlives its communicator).
#pragma once

#include <cstddef>

namespace mncl {

class Comm;

// Page-aligned, zeroed memory for `bytes` (at least a page). Throws InvalidUsage where the
// communicator is on a GPU, needs a window and has none, or its window is full.
void* allocateWindowMemory(Comm& comm, size_t bytes);

// Frees what allocateWindowMemory gave (null: nothing). Throws InvalidArgument for any other
// pointer, or one already freed.
void freeWindowMemory(void* p);

}  // namespace mncl
