#pragma once

namespace mncl {

// With MININCL_CPU_BIND=1, binds the calling thread to the localIndex-th CPU it may run on.
void maybeBindToCore(int localIndex);
// MININCL_CPU_BIND is 1 (0 or unset: no); any other value is an InvalidArgument.
bool cpuBindRequested();

}  // namespace mncl
