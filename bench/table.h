// The nccl-tests table, printed by rank 0.
#pragma once

#include <cstddef>

#include "collective.h"
#include "options.h"

namespace perf {

void printHeader(const Options& opt, int nranks);
// wrong < 0 prints N/A (no check requested).
void printRow(const Options& opt, const Shape& shape, double usec, double algbw, double busbw, long long wrong);
void printFooter(const Options& opt, double avgBusbw, long long totalWrong);

}  // namespace perf
