// What each collective means for the benchmark: buffer shapes for a message size (as
// nccl-tests defines them), the bus-bandwidth factor, and the C API call itself.
#pragma once

#include <cstddef>

#include "minincl.h"
#include "options.h"

namespace perf {

struct Shape {
  size_t bytes;       // the "size" column: bytes of the largest of the two buffers
  size_t paramCount;  // the count argument of the C call: the "count" column, as nccl-tests prints
  size_t sendCount;   // elements in the send buffer
  size_t recvCount;   // elements in the receive buffer
};

// Rounds `bytes` down so every rank's share is a whole number of elements.
Shape shapeFor(Coll coll, size_t bytes, size_t typeSize, int nranks);

// nccl-tests' factors: busbw = algbw * factor, what each rank's link carries.
double busFactor(Coll coll, int nranks);

bool hasRoot(Coll coll);
bool reduces(Coll coll);

// One call of the collective on this rank (sendrecv: to rank+1, from rank-1, in a group).
mnclResult_t runCollective(const Options& opt, const Shape& shape, const void* send, void* recv,
                           mnclComm_t comm, void* stream, int rank, int nranks);

}  // namespace perf
