// Correctness check: every rank's input is a fixed pattern of small integers (exact in every
// type), the expected output is computed on the host, and wrong elements are counted.
#pragma once

#include <cstddef>

#include "collective.h"
#include "options.h"

namespace perf {

// Writes rank `rank`'s input (shape.sendCount elements of opt.dtype) to hostSend.
void fillInput(const Options& opt, const Shape& shape, int rank, void* hostSend);

// Counts elements of hostRecv (shape.recvCount elements) that differ from the reference;
// 0 on ranks whose output is undefined (reduce, rank != root).
size_t countWrong(const Options& opt, const Shape& shape, int rank, int nranks, const void* hostRecv);

}  // namespace perf
