#pragma once

namespace mncl {

// With MININCL_CPU_BIND=1, binds the calling thread to the localIndex-th CPU it may run on.
void maybeBindToCore(int localIndex);

}  // namespace mncl
