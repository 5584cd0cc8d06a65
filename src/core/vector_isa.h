// MININCL_CPU_ISA: the vector instructions the CPU device code's 16- and 8-bit float arithmetic uses
// (cuda/cpu/narrow_float.h). By default the widest this CPU has; a narrower set, for tests and
// comparisons, gives the same bits more slowly. One setting per process: each communicator
// made applies its environment's.
#pragma once

#include <string>

namespace mncl {

// Applies MININCL_CPU_ISA ("portable", "avx2", "avx512"; unset: the widest); throws
// InvalidArgument for a name it does not know or a set this CPU lacks. Returns the set's name.
std::string applyVectorIsaSetting();
// The set's name now (before any communicator: the widest).
std::string vectorIsaInUse();

}  // namespace mncl
